"""The duplex turn-taking policy of the synthetic backbone, driven by voice activity.

Listen while the user talks, answer in the pause that follows, stop at once when the user talks
over the answer (barge-in).
"""
from __future__ import annotations

LISTEN, SPEAK = "listen", "speak"


class TurnPolicy:
    """Listen while the user talks, answer in the pause, stop when interrupted.

    The answer lasts as long as the user's turn did, capped at ``reply_seconds``. A second with
    user speech while speaking is a barge-in: the model falls silent at once and listens.
    """

    def __init__(self, reply_seconds: int = 4):
        self.reply_seconds = int(reply_seconds)
        self.user_seconds = 0      # length of the user's current (or last unanswered) turn
        self.left = 0              # seconds of answer still to speak
        self.barge_ins = 0

    def decide(self, user_speech: bool) -> str:
        if user_speech:
            if self.left > 0:
                self.barge_ins += 1
                self.left = 0
            self.user_seconds += 1
            return LISTEN
        if self.left == 0 and self.user_seconds > 0:      # the pause after a turn: answer it
            self.left = min(self.user_seconds, self.reply_seconds)
            self.user_seconds = 0
        if self.left > 0:
            self.left -= 1
            return SPEAK
        return LISTEN
