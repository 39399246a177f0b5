"""The folder dialog of every export (Export…, closing a running session, Recover): an existing folder, or the
name of a new one typed into it (created; its parent must exist).

Qt's own folder dialog refuses a folder that does not exist yet ("Directory not found").
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QMessageBox


def export_target(text: str) -> str:
    """What an export dialog's answer names: an existing folder, or a new one to create ("" for none)."""
    text = (text or "").strip()
    return str(Path(text).expanduser()) if text else ""


class ExportFolderDialog(QFileDialog):
    """Qt's folder dialog refuses a folder that does not exist ("Directory not found"); this one creates a
    typed new folder (its parent must exist) and accepts it."""

    def __init__(self, parent, title: str, start: str = ""):
        super().__init__(parent, title, start)
        self.setFileMode(QFileDialog.Directory)
        self.setOption(QFileDialog.ShowDirsOnly, True)
        self.setOption(QFileDialog.DontUseNativeDialog, True)   # the native one cannot be taught this
        self.setLabelText(QFileDialog.Accept, "Export here")
        self.error = ""

    def accept(self) -> None:
        files = self.selectedFiles()
        target = Path(files[0]).expanduser() if files else None
        if target is not None and not target.exists() and target.parent.is_dir():
            try:
                target.mkdir()
            except OSError as e:
                self.error = f"cannot create {target}: {e.strerror or e}"
                QMessageBox.warning(self, "Cannot create the folder", self.error)   # the dialog stays open
                return
        super().accept()


def choose_new_or_existing_folder(parent, title: str, start: str = "") -> str:
    """Ask for an export folder: an existing one or a typed new one (created). "" when cancelled."""
    dialog = ExportFolderDialog(parent, title, start)
    if not dialog.exec():
        return ""
    return export_target(dialog.selectedFiles()[0] if dialog.selectedFiles() else "")
