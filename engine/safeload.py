"""Bounded readers for every file a folder or a flag names: one clear line instead of a hang or a traceback.

Every file is opened without blocking and only when it is a regular file (a FIFO or ``/dev/zero`` is
refused at once), read up to a cap that depends on its kind, and parsed with limits:

* :func:`load_json`: nesting depth measured on the raw bytes before parsing (no ``RecursionError``),
  integers of at most :data:`MAX_DIGITS` digits, no NaN or infinity;
* :func:`load_yaml`: a safe loader (tags read as plain data, never constructed), refused before any
  node is composed when it nests too deep, holds too many aliases or events or a too-long number, and
  after loading when its aliases expand past a node budget (an alias bomb);
* :func:`folder` / :func:`inside`: a folder that can be listed and read, and the files an index names in it
  (plain file names; a link may resolve anywhere, as a hub snapshot's do, but only to a regular file);
* :func:`check_memory`: the memory a configuration implies against what this machine has.

Every failure is a :class:`FileCheckError` (a ``ValueError``) whose message names the file.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Optional, Tuple

import numpy as np

#: per kind of file, the most we read (the released files are far smaller)
CAPS = {"json": 32 << 20, "index": 16 << 20, "tokenizer": 32 << 20, "yaml": 1 << 20, "token": 64 << 10,
        "safetensors header": 64 << 20}
MAX_DEPTH = 64              # JSON / YAML nesting
MAX_DIGITS = 64             # digits of one integer
MAX_JSON_VALUES = 1 << 21   # values of one JSON file (parsing 2M small values costs ~150 MB; a config has hundreds)
MAX_YAML_ALIASES = 256
MAX_YAML_EVENTS = 10_000    # parse events before anything is composed (a released flow.yaml has ~300)
MAX_YAML_NODES = 200_000    # nodes once aliases are expanded
MAX_LINE = 16_384           # characters of one YAML line


class FileCheckError(ValueError):
    """A file or folder that cannot be used as it is; the message is one line naming it."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _reason(e: OSError) -> str:
    if isinstance(e, PermissionError):
        return "permission denied (make it readable, or run as its owner)"
    return e.strerror or str(e)


def _stat(p: Path, what: str, verb: str, missing: type = FileCheckError) -> os.stat_result:
    """``os.stat(p)``, or one line naming ``p``: ``missing`` when nothing is there, a FileCheckError
    ("cannot ``verb`` ...") when it cannot be looked at."""
    try:
        return os.stat(p)
    except FileNotFoundError:
        raise missing(f"{what} {p} does not exist") from None
    except OSError as e:
        raise FileCheckError(f"cannot {verb} {what} {p}: {_reason(e)}") from None


def _check_regular(st: os.stat_result, what: str, p: Path) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise FileCheckError(f"cannot read {what} {p}: it is {_kind(st.st_mode)}, not a regular file")


def regular_file(path, what: str) -> os.stat_result:
    """The ``os.stat`` of ``path`` when it is a regular file (a FIFO, a device or a folder is refused before
    anything opens it); a FileNotFoundError naming it when it is missing, a FileCheckError otherwise."""
    p = Path(path)
    st = _stat(p, what, "read", missing=FileNotFoundError)
    _check_regular(st, what, p)
    return st


def read_capped(path, cap: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, refused when larger than ``cap`` (never blocks)."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise FileCheckError(f"cannot read {what} {p}: {_reason(e)}") from None
    try:                                         # a folder opens read-only too: looked at before fdopen refuses it
        _check_regular(os.fstat(fd), what, p)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if st.st_size > cap:
            raise FileCheckError(f"{what} {p} is larger than {cap >> 10} KiB ({st.st_size:,} bytes); it cannot "
                                 f"be what its name says")
        try:
            data = f.read(cap + 1)
        except OSError as e:
            raise FileCheckError(f"cannot read {what} {p}: {_reason(e)}") from None
    if len(data) > cap:
        raise FileCheckError(f"{what} {p} grew past {cap >> 10} KiB while being read")
    return data


def read_text(path, cap: int, what: str) -> str:
    """:func:`read_capped` decoded as UTF-8 (one line when it is not)."""
    try:
        return read_capped(path, cap, what).decode("utf-8")
    except UnicodeDecodeError:
        raise FileCheckError(f"{what} {path} is not UTF-8 text") from None


# -- JSON ------------------------------------------------------------------------------------------------

_CHUNK = 1 << 20            # bytes measured at a time (its arrays stay under 40 MB at any file size)


def json_shape(raw: bytes) -> Tuple[int, int]:
    """(deepest nesting of ``[``/``{``, number of values) of a JSON text, measured outside its strings
    without parsing it: numpy over 1 MiB pieces of the bytes, so the cost is bounded at any size."""
    in_str, run, depth, deepest, commas = 0, 0, 0, 0, 0
    for start in range(0, len(raw), _CHUNK):
        c = np.frombuffer(raw, dtype=np.uint8, count=min(_CHUNK, len(raw) - start), offset=start)
        idx = np.arange(c.size, dtype=np.int32)
        last_plain = np.maximum.accumulate(np.where(c != 92, idx, -1))       # the last non-backslash so far
        quotes = np.flatnonzero(c == 34)
        before = np.where(quotes > 0, last_plain[np.maximum(quotes - 1, 0)], -1)
        slashes = quotes - 1 - before + np.where(before < 0, run, 0)         # a run may begin in the last piece
        toggle = np.zeros(c.size, dtype=np.int8)
        toggle[quotes[slashes % 2 == 0]] = 1                                 # unescaped quotes open or close
        inside = (np.cumsum(toggle, dtype=np.int32) - toggle + in_str) % 2 == 1
        outside = c[~inside & (toggle == 0)]
        commas += int(np.count_nonzero(outside == 44))
        br = outside[(outside == 91) | (outside == 123) | (outside == 93) | (outside == 125)]
        if br.size:
            levels = depth + np.cumsum(np.where((br == 91) | (br == 123), 1, -1).astype(np.int32))
            deepest, depth = max(deepest, int(levels.max())), int(levels[-1])
        in_str = (in_str + int(toggle.sum())) % 2
        tail = c.size - 1 - int(last_plain[-1])
        run = run + tail if tail == c.size else tail
    return deepest, commas + 1


def check_json_shape(raw: bytes, source: str, max_depth: int = MAX_DEPTH, max_values: int = MAX_JSON_VALUES) -> None:
    """FileCheckError when ``raw`` nests deeper than ``max_depth`` or holds more than ``max_values`` values
    (what parsing it would cost is bounded by these, not only by its size)."""
    depth, values = json_shape(raw)
    if depth > max_depth:
        raise FileCheckError(f"{source} is nested {depth:,} levels deep; a checkpoint's JSON needs at most "
                             f"{max_depth}")
    if values > max_values:
        raise FileCheckError(f"{source} holds {values:,} values, more than the {max_values:,} such a file has")


def _parse_int(source: str) -> Callable[[str], int]:
    def parse(s: str) -> int:
        if len(s.lstrip("-")) > MAX_DIGITS:
            raise FileCheckError(f"{source} holds an integer of {len(s.lstrip('-')):,} digits; "
                                 f"no field needs more than {MAX_DIGITS}")
        return int(s)
    return parse


def _parse_float(source: str) -> Callable[[str], float]:
    def parse(s: str) -> float:
        v = float(s)
        if not math.isfinite(v):
            raise FileCheckError(f"{source} holds the number {s[:20]}, which is not finite")
        return v
    return parse


def _no_constant(source: str) -> Callable[[str], Any]:
    def parse(s: str):
        raise FileCheckError(f"{source} holds {s}: every number must be finite")
    return parse


def parse_json(raw: bytes, source: str, max_depth: int = MAX_DEPTH, max_values: int = MAX_JSON_VALUES) -> Any:
    """JSON from bytes, its depth and number of values checked first; one FileCheckError naming ``source``."""
    check_json_shape(raw, source, max_depth, max_values)
    try:
        return json.loads(raw.decode("utf-8"), parse_int=_parse_int(source), parse_float=_parse_float(source),
                          parse_constant=_no_constant(source))
    except FileCheckError:
        raise
    except UnicodeDecodeError:
        raise FileCheckError(f"{source} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise FileCheckError(f"{source} is not valid JSON (line {e.lineno}: {e.msg})") from None
    except (ValueError, RecursionError) as e:
        raise FileCheckError(f"{source} is not valid JSON ({type(e).__name__})") from None


def load_json(path, what: str, cap: int = CAPS["json"], want: Optional[type] = dict) -> Any:
    """A JSON file read with :func:`read_capped` and :func:`parse_json`; ``want``: the top level's type."""
    doc = parse_json(read_capped(path, cap, what), f"{what} {path}")
    if want is not None and not isinstance(doc, want):
        raise FileCheckError(f"{what} {path} does not hold a JSON {'object' if want is dict else want.__name__}")
    return doc


# -- YAML ------------------------------------------------------------------------------------------------

_NUMBERISH = re.compile(r"[-+]?[0-9][0-9_]*$")


class _EventBudget:
    """Nesting, aliases, events and integer lengths, counted on each parse event as the composer takes it
    (one pass: the document is refused before a deep or large part of it is composed)."""

    def __init__(self, source: str):
        self.source, self.aliases, self.depth, self.events = source, 0, 0, 0

    def take(self, ev) -> None:
        import yaml
        src = self.source
        self.events += 1
        if self.events > MAX_YAML_EVENTS:
            raise FileCheckError(f"{src} holds more than {MAX_YAML_EVENTS:,} YAML nodes; not a configuration")
        if isinstance(ev, yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_YAML_ALIASES:
                raise FileCheckError(f"{src} holds more than {MAX_YAML_ALIASES} YAML aliases; not a configuration")
        elif isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise FileCheckError(f"{src} is nested deeper than {MAX_DEPTH} levels; not a configuration")
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            self.depth -= 1
        elif isinstance(ev, yaml.ScalarEvent) and ev.style is None and len(ev.value) > MAX_DIGITS \
                and _NUMBERISH.match(ev.value):
            raise FileCheckError(f"{src} holds an integer of {len(ev.value):,} digits; no field needs more "
                                 f"than {MAX_DIGITS}")


def _yaml_loader(keep_tags: bool):
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader reading every ``!tag`` as plain data (nothing is constructed or imported), every
        event counted by its ``budget`` as it is taken."""

        budget: _EventBudget

        def get_event(self):
            ev = super().get_event()
            self.budget.take(ev)
            return ev

    def tagged(loader, suffix, node):
        if isinstance(node, yaml.MappingNode):
            value = loader.construct_mapping(node, deep=True)
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_scalar(node)
        return {"__tag__": suffix, "args": value} if keep_tags else value
    Loader.add_multi_constructor("!", tagged)
    return Loader


def _check_lines(text: str, source: str) -> None:
    longest = max((len(line) for line in text.split("\n")), default=0)
    if longest > MAX_LINE:
        raise FileCheckError(f"{source} has a line of {longest:,} characters; a configuration's lines are "
                             f"shorter than {MAX_LINE:,}")


def count_nodes(doc: Any, budget: int, source: str) -> int:
    """Nodes of ``doc`` with shared (aliased) parts counted each time they appear; refused past ``budget``."""
    stack, n = [doc], 0
    while stack:
        node = stack.pop()
        n += 1
        if n > budget:
            raise FileCheckError(f"{source} expands to more than {budget:,} nodes (YAML aliases repeated); "
                                 f"not a configuration")
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    return n


def parse_yaml(text: str, source: str, keep_tags: bool = False, max_nodes: int = MAX_YAML_NODES,
               what: str = "YAML configuration") -> Any:
    """YAML text through every bound above; ``keep_tags``: a ``!tag`` node reads as ``{'__tag__', 'args'}``.
    ``source``: the file, as the messages name it; ``what``: what it should be."""
    import yaml
    _check_lines(text, source)
    loader = _yaml_loader(keep_tags)(text)
    loader.budget = _EventBudget(source)
    try:
        doc = loader.get_single_data()
    except FileCheckError:
        raise
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = " ".join(str(x) for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) \
            or "unreadable"
        raise FileCheckError(f"{source}: not a readable {what} (YAML{at}: {problem})") from None
    except (ValueError, RecursionError, OverflowError) as e:
        raise FileCheckError(f"{source}: not a readable {what} ({type(e).__name__})") from None
    finally:
        loader.dispose()
    count_nodes(doc, max_nodes, source)
    return doc


def load_yaml(path, what: str, cap: int = CAPS["yaml"], keep_tags: bool = False) -> Any:
    """A YAML file: :func:`read_text` with ``cap``, then :func:`parse_yaml`."""
    return parse_yaml(read_text(path, cap, what), str(path), keep_tags, what=what)


# -- typed fields ----------------------------------------------------------------------------------------

REQUIRED = object()


def _shown(v: Any) -> str:
    return f"{type(v).__name__} {v!r:.40}" if isinstance(v, (list, dict, str)) else f"{v!r:.40}"


def _lookup(doc: Any, key: str, source: str, default: Any) -> Tuple[bool, Any]:
    """(True, ``doc[key]``) when ``doc`` is a mapping holding ``key``; (False, ``default``) when it lacks it
    (REQUIRED: refused)."""
    if not isinstance(doc, dict):
        raise FileCheckError(f"{source} has the wrong type: a mapping is needed, found {_shown(doc)}")
    if key in doc:
        return True, doc[key]
    if default is REQUIRED:
        raise FileCheckError(f"{source} lacks {key!r}")
    return False, default


def integer(doc: Any, key: str, source: str, lo: int, hi: int, default: Any = REQUIRED) -> int:
    """``doc[key]`` as an integer (not a bool) in [lo, hi]; ``default`` when absent (REQUIRED: refused)."""
    found, v = _lookup(doc, key, source, default)
    if not found:
        return v
    if isinstance(v, float) and v.is_integer() and lo <= v <= hi:
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise FileCheckError(f"{source}: {key} must be a whole number from {lo:,} to {hi:,}, found {_shown(v)}")
    return v


def number(doc: Any, key: str, source: str, lo: float, hi: float, default: Any = REQUIRED) -> float:
    """``doc[key]`` as a finite number (not a bool) in [lo, hi]; ``default`` when absent."""
    found, v = _lookup(doc, key, source, default)
    if not found:
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise FileCheckError(f"{source}: {key} must be a finite number from {lo:g} to {hi:g}, found {_shown(v)}")
    return float(v)


# -- folders, files inside them --------------------------------------------------------------------------

def folder(path, what: str) -> Path:
    """``path`` as a folder this process can list and read inside; one line otherwise."""
    p = Path(path).expanduser()
    st = _stat(p, what, "open")
    if not stat.S_ISDIR(st.st_mode):
        raise FileCheckError(f"{what} {p} is {_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'a file'}, "
                             f"not a folder")
    if not os.access(p, os.R_OK | os.X_OK):
        raise FileCheckError(f"cannot open {what} {p}: permission denied (it needs read and execute "
                             f"permission: chmod u+rx)")
    try:
        with os.scandir(p) as it:
            next(it, None)
    except OSError as e:
        raise FileCheckError(f"cannot open {what} {p}: {_reason(e)}") from None
    return p


def inside(root, name, named_by: str) -> Path:
    """``root/name`` for a file name an index or a config gives: a plain file name in ``root`` (no folder part,
    no absolute path, no ``..``). It may be a symbolic link that resolves anywhere, as the files of a Hugging
    Face hub snapshot are (``snapshots/REV/NAME -> ../../blobs/HASH``), but only to a regular file: a link to a
    device, a FIFO, a socket or a folder is refused before anything opens it. A name that is not there is the
    caller's to report."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise FileCheckError(f"{named_by} names a file {name!r:.60}: not a file name")
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise FileCheckError(f"{named_by} names {name!r:.80}, outside the folder; shards must be files in "
                             f"the folder")
    if len(rel.parts) != 1 or "/" in name or "\\" in name or name == ".":
        raise FileCheckError(f"{named_by} names {name!r:.80}, not a plain file name; shards must be files in "
                             f"the folder itself (a file there may be a link, as in a hub download)")
    p = Path(root) / rel
    try:
        st = os.stat(p)                                    # through any link: what would be opened
    except FileNotFoundError:
        return p
    except OSError as e:
        raise FileCheckError(f"cannot read {p}, named by {named_by}: {_reason(e)}") from None
    if not stat.S_ISREG(st.st_mode):
        how = f"a link to {_kind(st.st_mode)}" if os.path.islink(p) else _kind(st.st_mode)
        raise FileCheckError(f"{named_by} names {name!r:.80}, which is {how}; a shard must be a regular file "
                             f"(or a link to one)")
    return p


def is_file(p: Path) -> bool:
    """``Path.is_file`` that reads a permission error as "not there" (the caller says what is missing)."""
    try:
        return p.is_file()
    except OSError:
        return False


@contextmanager
def quiet_stderr():
    """File descriptor 2 sent to a scratch file for the duration (a native library's panic report, which
    it writes itself before Python sees the exception, must not reach the user's terminal)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        with tempfile.TemporaryFile() as scratch:
            os.dup2(scratch.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


# -- memory ----------------------------------------------------------------------------------------------

def machine_memory() -> int:
    """Bytes of physical memory (``/proc/meminfo`` MemTotal, else ``os.sysconf``), plus the first CUDA
    device's when torch is loaded and sees one (weights built there do not use host memory)."""
    total = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        total = 0
    if not total:
        try:
            total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            total = 1 << 62
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            total += int(torch.cuda.get_device_properties(0).total_memory)
    except Exception:                                      # noqa: BLE001 — no device: host memory only
        pass
    return total


def check_memory(need: float, source: str, what: str) -> None:
    """One line when ``need`` bytes (what ``source``'s ``what`` implies) exceed this machine's memory."""
    have = machine_memory()
    if need > have:
        raise FileCheckError(f"{source}: {what} needs about {need / 2 ** 30:,.1f} GiB, more than the "
                             f"{have / 2 ** 30:,.1f} GiB this machine has; the configuration is wrong or "
                             f"belongs on a larger machine")
