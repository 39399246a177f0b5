"""The duplex session: one second in, LISTEN -> THINK -> SPEAK, one second out, every second on the record.

``DuplexSession`` runs seconds synchronously; ``LiveRunner`` runs them on a worker thread for a GUI
or a paced input; ``export_records`` writes CSV, JSON Lines and a Chrome/Perfetto trace.
"""
from .config import SessionConfig
from .export import ExportError, export_records
from .live import LiveError, LiveResult, LiveRunner
from .records import SecondRecord, format_summary, summarize
from .session import DuplexSession

__all__ = ["SessionConfig", "DuplexSession", "SecondRecord", "LiveRunner", "LiveResult", "LiveError",
           "export_records", "ExportError", "summarize", "format_summary"]
