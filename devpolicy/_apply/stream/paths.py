"""A stream's read paths: those opened for its source, the one that reads the next group,
why it is that one, and the trials that time the others (`choosing`).

The paths are opened when the stream starts, by the rules' first guess
(`reads.opening`), with Ctrl-C held back so no descriptor is ever left without an owner;
a file read through a ring has its kept mapping looked at and opened when it is first
timed (`reads.opening.open_later`), so a fresh stream's first batch waits for neither.
Where more than one is safe for the file, the stream times them on its own groups and
keeps the fastest; where the path in use can no longer serve (a kept mapping that lost
its pages' room), the file is read by position from then on. A path is changed only
between two groups, with nothing read ahead (the cutter asks here between groups), and
every path gives the same windows, so a change never skips or repeats a step.
"""

from __future__ import annotations

from .choosing import PathTrials
from .interrupts import deferred_interrupts
from .reading import ReadOptions
from .reads import ReadPath
from .reads.kept import KeptMapping
from .reads.opening import Source, file_path, file_reader, open_later, open_paths
from .reads.positional import PositionalReads


class StreamPaths:
    """The read paths of one stream's source, and which reads the next group (`read`;
    None until opened, and for tokens in memory before then). One owner: the cutter."""

    __slots__ = (
        "_options",
        "_paths",
        "_source",
        "_trial_step",
        "_trials",
        "_tried_file",
        "_why",
        "opened",
        "read",
        "reads_with",
    )

    def __init__(self, source: Source, options: ReadOptions) -> None:
        self._source = source
        self._options = options
        self._paths: dict[str, ReadPath] = {}  # opened at the start, by key
        self.read: ReadPath | None = None  # the path that reads the next group
        self.opened = False
        self._tried_file = False  # whether reading by position was tried mid-stream
        self.reads_with: str | None = None  # for "file": the reader's way
        self._why = "the tokens are in memory"  # why `reads`, for `stream_ended`
        self._trials: PathTrials | None = None  # where several paths are safe: timed
        self._trial_step = 0  # the step a trial last ended at

    @property
    def reads(self) -> str:
        """How windows are copied: "file", "mapping" or "memory"."""
        read = self.read
        return "memory" if read is None else read.reads

    @property
    def reads_why(self) -> str:
        """Why the stream reads as it does (`reads`), and what its trials measured."""
        trials = self._trials
        if trials is None or not trials.why:
            return self._why
        if not trials.decisions:
            return f"{self._why}; started on {trials.path}, {trials.why}"
        return (
            f"{self._why}; timed on its own groups ({', '.join(trials.candidates)}), "
            f"{trials.decisions} time(s), the last at step {self._trial_step}: {trials.why}"
        )

    @property
    def timing(self) -> PathTrials | None:
        """The trials timing the paths, where more than one is safe and none gave up."""
        return self._trials

    def grouped(self) -> bool:
        """Whether a path reads a group in one system call (then groups are larger)."""
        return any(path.grouped for path in self._paths.values())

    def open(self) -> None:
        """Open the read paths (`reads.opening`), with Ctrl-C held back; where more than
        one is safe, the trials that time them start on the rules' guess (or on where an
        earlier stream of these files settled lately)."""
        options = self._options
        with deferred_interrupts():
            opened = open_paths(self._source, options)
            self._paths = opened.paths
            self.opened = True
        self._why = opened.why
        first = opened.first
        if len(opened.candidates) > 1:
            reader = getattr(self._paths.get("file"), "reader", None)
            trials = self._trials = PathTrials(
                opened.candidates,
                first,
                groups=options.trial_groups,
                rounds=options.trial_rounds,
                recheck=options.recheck_seconds,
                source=None if reader is None else (reader.identity, reader.way),
            )
            first = trials.path
        self.read = self._path(first)

    def _path(self, key: str) -> ReadPath:
        """The path `key`, opened now where its opening was put off (whether the kept
        mapping is safe is looked at when it is first timed, not before a fresh stream's
        first batch); where it is not safe now, the trials end on the path in use."""
        path = self._paths.get(key)
        if path is not None:
            return path
        file = self._paths["file"]
        assert isinstance(file, PositionalReads)
        with deferred_interrupts():
            path, why = open_later(key, self._source, self._options, file.reader)
            if path is not None:
                self._paths[key] = path
        if path is None:
            self._why += f"; {why}"
            self._trials = None
            return self.read or file
        return path

    def next_path(self, first: int) -> None:
        """Between two groups, nothing read ahead, from step `first` on: where the path in
        use gave up, read by position; else the path the trials say (once a trial settles
        on reading by position, the mapping's pages it brought in are given back)."""
        current = self.read
        assert current is not None
        why = None if self._tried_file else current.given_up()
        if why is not None:
            self._read_by_position(why, first)
            return
        trials = self._trials
        if trials is None:
            return
        before = trials.decisions
        read = self._path(trials.next_path())
        if trials.decisions != before:
            self._trial_step = first
            for path in self._paths.values():
                if path is not read and isinstance(path, KeptMapping):
                    path.sweep()
        self.read = read

    def _read_by_position(self, why: str, first: int) -> None:
        """The path in use can no longer serve (`why`): from step `first` read the windows
        from the file by position (nothing is mapped, so nothing needs giving back), its
        pages given back. Where the file cannot be read so, the stream goes on as it was."""
        self._tried_file = True
        with deferred_interrupts():
            if "file" not in self._paths:
                reader = file_reader(self._source, self._options)
                if reader is None:
                    return
                self._paths["file"] = file_path(reader, self._source)
        self._why = self.reads_why + f"; at step {first} {why}: read by position from then on"
        self._trials = None  # no path but this one is safe now
        old = self.read
        self.read = read = self._paths["file"]
        if old is not None and old is not read:
            del self._paths[old.key]
            old.close(sweep=True)

    def close(self, *, child: bool | None) -> None:
        """Close every path (`child` not None: abandoned, in a forked child or not),
        keeping how the file was read, where the stream read it last, for the event."""
        self.opened = True  # never opened again
        paths, self._paths = self._paths, {}
        for path in paths.values():
            try:
                if path is self.read and path.way is not None:
                    self.reads_with = path.way
                if child is None:
                    path.close()
                else:
                    path.abandon(child=child)
            except Exception:
                if child is None:
                    raise
