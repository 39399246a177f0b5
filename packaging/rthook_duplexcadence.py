"""PyInstaller runtime hook: let sounddevice fall back to the PortAudio library inside the bundle.

sounddevice looks PortAudio up with ``ctypes.util.find_library("portaudio")``, which on Linux only
searches the system (ldconfig). The system library is preferred (it matches the local ALSA/Pulse
setup); when there is none, the copy collected at build time in ``sys._MEIPASS`` is used, so the
bundle also runs on machines without ``libportaudio2``.
"""
import ctypes.util
import glob
import os
import sys

_system_find_library = ctypes.util.find_library


def _find_library(name):
    found = _system_find_library(name)
    if found is None and name == "portaudio":
        bundled = sorted(glob.glob(os.path.join(sys._MEIPASS, "libportaudio.so*")))
        found = bundled[0] if bundled else None
    return found


ctypes.util.find_library = _find_library
