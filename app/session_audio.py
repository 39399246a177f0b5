"""The session's audio devices (a mixin of :class:`app.controller.SessionController`, GUI thread only).

The speaker's playback (the bounded queue with the user's delay), push-to-talk, switching the microphone or the
speaker of a running session, a device that fails (the session goes on: silence in, or no playback), the
meters the window shows, and the play-out of the last seconds once the input ended.
"""
from __future__ import annotations

import time
from typing import Optional

from app.alsa_log import drained_lines
from app.audio_io import InputSource, Playback, SilentInput
from app.states import RUNNING, STARTING

#: the warning when the user talks while the model is being built
UNHEARD = ("The model is still loading: what you say now is not heard. Talk once the state reads LISTENING.")


class SessionAudio:
    """Microphone and speaker of the running session: switched, checked, metered, played out."""

    def _playback(self, sink) -> Optional[Playback]:
        if sink is None:
            return None
        sink.queue.set_delay(self.controls.delay_s)
        return Playback(sink)

    def _halt_audio(self) -> None:
        if self.pump is not None:
            self.pump.halt()
        for dev in (self.source, self.sink):
            if dev is not None:
                dev.stop()

    def set_push_to_talk(self, enabled: bool) -> None:
        self._push_to_talk = bool(enabled)
        if self.pump is not None:
            self.pump.push_to_talk = self._push_to_talk

    def press_talk(self, pressed: bool) -> None:
        if self.pump is not None:
            self.pump.press_talk(pressed)

    def replace_input(self, source: InputSource) -> None:
        """Switch the microphone of a running session (raises AudioUnavailable if it cannot open)."""
        if self.pump is None or self.state not in (STARTING, RUNNING):
            return
        if not (source.deferred and self.state == STARTING):     # else _on_ready starts it
            source.start()
        old, self.source = self.source, source
        self.pump.replace_source(source)
        old.stop()

    def replace_output(self, sink) -> None:
        """Switch (or, with None, mute) the speaker of a running session."""
        if self.pump is None or self.state not in (STARTING, RUNNING):
            return
        if sink is not None:
            sink.start()
        old, self.sink = self.sink, sink
        self.pump.playback = self._playback(sink)
        if old is not None:
            old.stop()

    def _playing_out(self) -> bool:
        """After the last second: whether the speaker still plays what the last seconds queued. The sink is told
        that no more is coming (it plays the rest without waiting for its buffer delay); the session waits as
        long as that takes, plus a second, and then stops whatever is left."""
        pb = self.pump.playback if self.pump is not None else None
        left = pb.queued_s() if pb is not None else 0.0
        if left <= 0.0:
            return False
        now = time.monotonic()
        if self._playout_until is None:
            self._playout_until = now + left + 1.0
            play_out = getattr(pb.sink, "play_out", None)
            if play_out is not None:
                play_out()
        return now < self._playout_until

    def _check_devices(self) -> None:
        failure = self.source.check()
        if failure and getattr(self.source, "bad_data", False):
            self.fail(f"{failure}; the session stopped there (everything before it is kept)")
            return
        if failure:
            self.message.emit("warning", f"{failure}; the session continues on silence — pick another "
                                         "input or a WAV file")
            self.event.emit("device", failure)
            self.replace_input(SilentInput(self.pump.rate))
        if self.sink is not None:
            failure = self.sink.check()
            if failure:
                self.message.emit("warning", f"{failure}; playback is off (output audio is still recorded)")
                self.event.emit("device", failure)
                self.replace_output(None)
        while self.pump.events:
            self.event.emit(*self.pump.events.popleft())
        for line in drained_lines():                # ALSA's own lines (underruns), counted, not on the terminal
            self.event.emit("alsa", line)

    def _check_unheard(self) -> None:
        """Speech while the model is still being built is not heard: say so once, at once (banner, event log,
        a scripted run's stderr); how much of it there was is said when the session starts listening."""
        if self.state == STARTING and self.pump.unheard_s > 0 and not self._unheard_said:
            self._unheard_said = True
            self.message.emit("warning", UNHEARD)

    def _emit_meters(self) -> None:
        pump, src, sink = self.pump, self.source, self.sink
        self.totals["input_dropped"] = self.input_dropped
        self.meters.emit({
            "totals": dict(self.totals),
            "echo": bool(pump.canceller is not None and pump.canceller.enabled),
            "echo_error": pump.echo_error,
            "starting": self.state == STARTING,
            "unheard_s": pump.unheard_s,
            "level_db": pump.level_db,
            "mic_open": pump.talking or not pump.push_to_talk,
            "xruns": src.xruns + src.ring.overflows + (sink.xruns if sink is not None else 0),
            "backlog": self.runner.backlog(),
            "playback_s": pump.playback.queued_s() if pump.playback is not None else 0.0,
            "output_db": pump.playback.playing_level_db() if pump.playback is not None else None,
            "barge_ins": pump.barge_ins,
            "submitted": self.submitted,
        })
