"""PyInstaller runtime hook: make sounddevice load the PortAudio library shipped in the bundle.

sounddevice looks PortAudio up with ``ctypes.util.find_library("portaudio")``, which on Linux only
asks the system (ldconfig) and so finds nothing where ``libportaudio2`` is not installed. This hook
answers with the copy collected at build time in ``sys._MEIPASS``, so audio devices work on any
machine; PortAudio then uses the system's ALSA (``libasound.so.2`` is deliberately not bundled) and
through it PulseAudio or PipeWire. Without ALSA, importing sounddevice fails and the app says so.
"""
import ctypes.util
import glob
import os
import sys

_system_find_library = ctypes.util.find_library


def _find_library(name):
    if name == "portaudio":
        bundled = sorted(glob.glob(os.path.join(sys._MEIPASS, "libportaudio.so*")))
        if bundled:
            return bundled[0]
    return _system_find_library(name)


ctypes.util.find_library = _find_library
