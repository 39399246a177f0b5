"""The main window's menus, shortcuts, replay launcher, push-to-talk key and palette handling.

A mixin of :class:`app.window.MainWindow` (it uses the window's controller, panels and buttons):
File (Open session…, Open beside…, Export…, Quit) and Session (Start, Stop) menus whose shortcuts
appear in the menus and in the buttons' tooltips; the replay window for exported sessions; Space
for push-to-talk with key autorepeat ignored; plots re-themed when the palette changes.
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QAction, QKeyEvent, QKeySequence
from PySide6.QtWidgets import QApplication, QFileDialog, QLineEdit

from app import theme
from app.folder_dialog import ExportFolderDialog, choose_new_or_existing_folder, export_target  # noqa: F401

#: keyboard shortcuts (shown in the menus and the buttons' tooltips)
KEYS = {"start": "Ctrl+R", "stop": "Ctrl+.", "export": "Ctrl+E", "open": "Ctrl+O", "beside": "Ctrl+Shift+O"}
#: a Space release followed this soon by a press is key autorepeat, not the user letting go
PTT_RELEASE_MS = 120


class WindowActions:
    """Menus, shortcuts, replay, the push-to-talk key and palette changes for the main window."""

    def _build_menus(self) -> None:
        """File and Session menus; their shortcuts work anywhere in the window."""
        def action(text: str, key: str, slot, tip: str) -> QAction:
            a = QAction(text, self, shortcut=QKeySequence(KEYS[key]), triggered=slot)
            a.setToolTip(f"{tip} ({KEYS[key]})")
            a.setShortcutContext(Qt.WindowShortcut)
            self.addAction(a)
            return a

        self.open_action = action("Open session…", "open", self.open_session_dialog,
                                  "show an exported session folder with the same plots")
        self.beside_action = action("Open beside…", "beside", lambda: self.open_session_dialog(beside=True),
                                    "open a second exported session beside the one shown, to compare them")
        self.export_action = action("Export…", "export", self.export_dialog, self.export_button.toolTip())
        self.start_action = action("Start", "start", self.start_session, "build the model and start listening")
        self.stop_action = action("Stop", "stop", self.controller.stop, "stop after the second in progress")
        self.export_action.setEnabled(False)
        self.stop_action.setEnabled(False)
        file_menu = self.menuBar().addMenu("&File")
        file_menu.addAction(self.open_action)
        file_menu.addAction(self.beside_action)
        self.recent_menu = file_menu.addMenu("Recent sessions")
        self.recent_menu.setToolTip("the sessions kept in the app's session folder (newest first)")
        self.recent_menu.aboutToShow.connect(self.fill_recent_menu)
        self.fill_recent_menu()
        file_menu.addAction(self.export_action)
        file_menu.addSeparator()
        file_menu.addAction(QAction("Quit", self, shortcut=QKeySequence.Quit, triggered=self.close))
        session_menu = self.menuBar().addMenu("&Session")
        session_menu.addAction(self.start_action)
        session_menu.addAction(self.stop_action)

    def fill_recent_menu(self) -> list:
        """File → Recent sessions: the newest kept sessions (interactive and scripted), each opens a replay."""
        from app.lifecycle import recent_sessions, session_label
        self.recent_menu.clear()
        self.recent_menu.setToolTipsVisible(True)
        folders = recent_sessions()
        for folder in folders:
            tag = " (scripted)" if folder.parent.name == "scripted" else ""
            action = self.recent_menu.addAction(f"{session_label(folder)}{tag}", lambda f=folder: self.open_session(f))
            action.setToolTip(str(folder))
        if not folders:
            self.recent_menu.addAction("(no finished sessions yet)").setEnabled(False)
        return folders

    def choose_export_folder(self, title: str) -> str:
        """A folder for an export: an existing one, or a typed name of a new one (created). "" when cancelled."""
        return choose_new_or_existing_folder(self, title, self.settings.export_dir)

    # -- replay ---------------------------------------------------------------------------------
    def open_session_dialog(self, beside: bool = False) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Open an exported session folder", self.settings.export_dir)
        if folder:
            self.open_session(folder, beside=beside)

    def open_session(self, folder, beside: bool = False):
        """Show an exported session in the replay window (beside the one it shows, with ``beside``);
        returns the replay window, or None after one error line."""
        from app.review import CompareWindow
        if self._replay is None:
            self._replay = CompareWindow()
        if self._replay.open_folder(folder, beside=beside) is None:
            self.show_message("error", self._replay.error_banner.text())
            return None
        self._replay.show()
        self._replay.raise_()
        return self._replay

    # -- keys and palette -----------------------------------------------------------------------
    def eventFilter(self, obj, event) -> bool:
        if event.type() in (QEvent.KeyPress, QEvent.KeyRelease) and isinstance(event, QKeyEvent) \
                and event.key() == Qt.Key_Space and self.device_panel.ptt.isChecked() \
                and not isinstance(QApplication.focusWidget(), QLineEdit):
            if not event.isAutoRepeat():
                self._talk_key(event.type() == QEvent.KeyPress)
            return True
        return super().eventFilter(obj, event)

    def _talk_key(self, pressed: bool) -> None:
        """Space down/up. A release is acted on only after PTT_RELEASE_MS without a new press: some
        X servers deliver autorepeat as release+press pairs that Qt cannot always tell apart."""
        if pressed:
            if self._ptt_release.isActive():
                self._ptt_release.stop()             # a repeat: the key never went up
                return
            self.controller.press_talk(True)
        else:
            self._ptt_release.start()

    def changeEvent(self, event) -> None:
        if event.type() in (QEvent.PaletteChange, QEvent.ApplicationPaletteChange):
            theme.apply_all(self, self.palette())     # the system switched light/dark: plots follow
        super().changeEvent(event)
