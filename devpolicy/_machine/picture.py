"""A picture of a `Ledger`: each device's bytes by rule against its memory, the streams,
the rules by bytes and the fallbacks taken, as bars in a terminal or as one HTML page.

Nothing here measures or estimates: it draws what `report` measured and says where each
figure was read (`LedgerDevice.free_from`, `total_from`). The page is one self-contained
file: its style inline, its bars plain `div`s, nothing fetched from anywhere, so it opens
offline and from a CI artifact. Every name comes from a user or a file and is escaped
(`html.escape`), never read as markup. The page is written whole or not at all: to a
temporary file beside it, then renamed over it.

`Ledger.bars` and `Ledger.to_html` hand their fields down here (the ledger's rows, its
streams, the fallbacks counted): the picture sits below the ledger and never imports it.
"""

from __future__ import annotations

import errno
import html
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._base.sizes import format_size
from .fallbacks import FallbackCount
from .rows import LedgerDevice, LedgerEntry, TransferSite
from .streams import LedgerStream, printable

UNPLACED = "unplaced"  # as `ledger.UNPLACED`: arrays devpolicy did not place

#: Each rule's cells in a terminal, in the order of `rules` (the most bytes first);
#: `unplaced`, memory in use otherwise and free memory have their own.
_RULE_CELLS = ("█", "▓", "▒", "▚", "▞", "▙", "▟", "▛", "▜")
_ASCII_RULE_CELLS = ("#", "=", "+", "%", "*", "@", "&", "x", "o")
_UNICODE = {"unplaced": "░", "other": "╌", "free": " ", "edge": "│", "wait": "█", "work": "░"}
_ASCII = {"unplaced": ".", "other": "-", "free": " ", "edge": "|", "wait": "#", "work": "."}
#: Each rule's colour on the page, in the same order; `unplaced` is grey.
_COLOURS = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
)
_UNPLACED_COLOUR = "#9e9e9e"
NOT_MEASURED = "not measured yet"
OTHER_USE = "in use, not by this device's arrays"


@dataclass(frozen=True, slots=True)
class RuleTotal:
    """One rule's arrays and bytes over every device (`unplaced` too)."""

    origin: str
    rule: int | None
    label: str
    arrays: int
    nbytes: int
    file_backed: int
    devices: tuple[str, ...]


def rules(devices: Sequence[LedgerDevice]) -> list[RuleTotal]:
    """Each rule's totals over every device, the most bytes first, `unplaced` last; an
    array spread over several devices counts once on each (as a shard)."""
    names = labels(devices)
    sums: dict[tuple[str, int | None], tuple[int, int, int]] = {}
    where: dict[tuple[str, int | None], list[str]] = {}
    for d in devices:
        for e in d.entries:
            arrays, nbytes, backed = sums.get((e.origin, e.rule), (0, 0, 0))
            sums[e.origin, e.rule] = (arrays + e.arrays, nbytes + e.nbytes, backed + e.file_backed)
            where.setdefault((e.origin, e.rule), []).append(d.device)
    totals = [
        RuleTotal(
            origin, rule, names[origin, rule], *sums[origin, rule], tuple(where[origin, rule])
        )
        for origin, rule in sums
    ]
    return sorted(totals, key=lambda r: (r.origin == UNPLACED, -r.nbytes, r.label))


def labels(devices: Iterable[LedgerDevice]) -> dict[tuple[str, int | None], str]:
    """Each (origin, rule) as shown: the origin, with the rule's index where two rules
    share one origin text (every item of `DEVPOLICY_RULES` is `env:DEVPOLICY_RULES`)."""
    keys = {(e.origin, e.rule) for d in devices for e in d.entries}
    shared: dict[str, int] = {}
    for origin, _ in keys:
        shared[origin] = shared.get(origin, 0) + 1
    return {
        (origin, rule): f"{printable(origin)} item {rule}"
        if shared[origin] > 1 and rule is not None
        else printable(origin)
        for origin, rule in keys
    }


def _names(names: Sequence[str], limit: int) -> str:
    shown = ", ".join(printable(n) for n in names[:limit])
    return shown + (f", ... ({len(names):,} names)" if len(names) > limit else "")


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _segments(device: LedgerDevice) -> tuple[list[tuple[LedgerEntry | str, int]], int]:
    """The bar of one device: (an entry, or `other` or `free`, bytes) in order, and the
    bytes the whole bar stands for: its memory in all where measured, else its arrays."""
    parts: list[tuple[LedgerEntry | str, int]] = [(e, e.nbytes) for e in device.entries]
    if device.total is None:
        return parts, device.nbytes
    free = device.free or 0
    other = max(0, device.total - device.nbytes - free)
    parts += [("other", other), ("free", free)]
    return parts, max(device.total, device.nbytes + free)


def _cells(amounts: Sequence[int], whole: int, width: int, least: Sequence[bool]) -> list[int]:
    """`width` cells shared out by `amounts` of `whole` (largest remainders first); an
    amount marked in `least` that is not 0 gets at least one, taken from the largest."""
    if whole <= 0:
        return [0] * len(amounts)
    exact = [a * width / whole for a in amounts]
    cells = [int(x) for x in exact]
    spare = width - sum(cells)
    for i in sorted(range(len(amounts)), key=lambda i: cells[i] - exact[i])[: max(0, spare)]:
        cells[i] += 1
    for i, amount in enumerate(amounts):
        if least[i] and amount > 0 and cells[i] == 0:
            biggest = max(range(len(cells)), key=lambda j: cells[j])
            if cells[biggest] > 1:
                cells[biggest] -= 1
            cells[i] = 1
    return cells


def _can_draw(stream: object) -> bool:
    """Whether `stream`'s encoding can write the block characters the bars are drawn in."""
    encoding = getattr(stream, "encoding", None) or "ascii"
    try:
        "".join((*_RULE_CELLS, *_UNICODE.values())).encode(encoding)
    except (LookupError, UnicodeEncodeError):
        return False
    return True


def bars(
    devices: Sequence[LedgerDevice],
    streams: Sequence[LedgerStream],
    fallbacks: Sequence[FallbackCount],
    width: int = 40,
    ascii_only: bool | None = None,
) -> str:
    """The terminal picture: see `Ledger.bars`."""
    if isinstance(width, bool) or not isinstance(width, int) or not 8 <= width <= 1000:
        raise ValueError(f"width is the bar's cells, a whole number 8..1000, got: {width!r}")
    plain = not _can_draw(sys.stdout) if ascii_only is None else ascii_only
    marks, symbols = (_ASCII_RULE_CELLS, _ASCII) if plain else (_RULE_CELLS, _UNICODE)
    totals = rules(devices)
    cell = {
        (r.origin, r.rule): symbols["unplaced"] if r.origin == UNPLACED else marks[i % len(marks)]
        for i, r in enumerate(totals)
    }
    label = {(r.origin, r.rule): r.label for r in totals}
    edge = symbols["edge"]
    lines = ["devices (devpolicy.report, bars):"]
    if not devices:
        lines.append("  no devices in this ledger")
    for d in devices:
        free = "free memory unknown" if d.free is None else f"{format_size(d.free)} free"
        lines.append(
            f"{d.device} ({d.pool}): {_plural(d.arrays, 'array')}, {format_size(d.nbytes)}; {free}"
        )
        parts, whole = _segments(d)
        least = [not isinstance(p, str) for p, _ in parts]
        counts = _cells([n for _, n in parts], whole, width, least)
        drawn = "".join(
            (symbols[p] if isinstance(p, str) else cell[p.origin, p.rule]) * n
            for (p, _), n in zip(parts, counts, strict=True)
        )
        if whole > 0:
            lines.append(f"  {edge}{drawn}{edge}")
        sizes = [format_size(n) for p, n in parts if not (isinstance(p, str) and p == "free")]
        column = max((len(s) for s in sizes), default=0)
        for p, n in parts:
            if isinstance(p, str):
                if p == "other" and n:
                    lines.append(f"  {symbols['other']} {format_size(n):>{column}}  {OTHER_USE}")
                continue
            backed = f", {format_size(p.file_backed)} file-backed" if p.file_backed else ""
            lines.append(
                f"  {cell[p.origin, p.rule]} {format_size(n):>{column}}  "
                f"{label[p.origin, p.rule]} ({_plural(p.arrays, 'array')}{backed})"
                + (f": {_names(p.names, 3)}" if p.names else "")
            )
        lines.append(f"  {_capacity_text(d)}")
    lines += _stream_bars(streams, symbols)
    lines += _rule_lines(totals)
    lines += _fallback_lines(fallbacks)
    return "\n".join(lines)


def _capacity_text(d: LedgerDevice) -> str:
    if d.total is None:
        said = "capacity unknown"
        if d.nbytes:
            said += ": the bar is its arrays alone"
    else:
        said = f"capacity {format_size(d.total)} ({d.total_from})"
    if d.free is not None:
        said += f"; free from {d.free_from or 'the capacity given'}"
    return said


def _share(value: float | None, digits: int = 1) -> str:
    return NOT_MEASURED if value is None else f"{value:.{digits}%}"


def _rate(stream: LedgerStream) -> str:
    rate = stream.rate
    return NOT_MEASURED if rate is None else f"{rate:,.1f} batches/s"


def _stream_bars(listed: Sequence[LedgerStream], symbols: dict[str, str]) -> list[str]:
    if not listed:
        return []
    lines = ["streams (the caller's loop: waited in next() against its own work):"]
    for s in listed:
        state = "open" if s.open else "ended"
        reads = s.reads or NOT_MEASURED
        share = s.waited_share
        drawn = ""
        if share is not None:
            waited = round(share * 20)
            drawn = f"  {symbols['edge']}{symbols['wait'] * waited}"
            drawn += f"{symbols['work'] * (20 - waited)}{symbols['edge']}"
        lines.append(
            f"  {printable(s.name)} ({state}, on {printable(s.device)}): "
            f"{s.batches:,} {'batch' if s.batches == 1 else 'batches'}, "
            f"{format_size(s.nbytes)}; reads {printable(reads)}; {_rate(s)}; "
            f"waited {_share(share)}{drawn}"
        )
    return lines


def _rule_lines(totals: Sequence[RuleTotal]) -> list[str]:
    if not totals:
        return []
    lines = ["rules by bytes (every device; a sharded array once on each of its devices):"]
    column = max(len(r.label) for r in totals)
    for r in totals:
        lines.append(
            f"  {r.label:{column}}  {_plural(r.arrays, 'array')}, {format_size(r.nbytes)} "
            f"on {', '.join(r.devices)}"
        )
    return lines


def _fallback_lines(counted: Sequence[FallbackCount]) -> list[str]:
    if not counted:
        return ["fallbacks taken: none counted in this process"]
    lines = ["fallbacks taken (decisions, counted as made):"]
    for f in counted:
        way = "as the rule declared" if f.declared else "by the policy's chain"
        why = "too small" if f.short else "not there"
        lines.append(
            f"  {printable(f.origin)}: asked {printable(f.requested)} ({why}), used "
            f"{printable(f.used)} {way}: {_plural(f.decisions, 'decision')}, "
            f"{format_size(f.nbytes)}"
        )
    return lines


_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#222;
max-width:1100px}
h1{font-size:20px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 4px}
.bar{display:flex;height:22px;border:1px solid #888;border-radius:3px;overflow:hidden;
background:#fff;margin:4px 0}
.seg{height:100%;min-width:2px;box-sizing:border-box;border-right:1px solid #fff}
.seg.free{background:#fff;min-width:0;border-right:0}
.seg.other{background:repeating-linear-gradient(45deg,#ddd 0 4px,#f4f4f4 4px 8px)}
.swatch{display:inline-block;width:12px;height:12px;vertical-align:middle;
border:1px solid #888;margin-right:6px}
table{border-collapse:collapse;margin:6px 0}
td,th{padding:2px 10px 2px 0;text-align:left;vertical-align:top}
td.n,th.n{text-align:right}
.src{color:#666;font-size:12px}
.none{color:#666;font-style:italic}
.wait{display:inline-block;width:120px;height:10px;border:1px solid #888;
vertical-align:middle;background:#eee}
.wait span{display:block;height:100%;background:#e15759}
"""


def _e(text: object) -> str:
    """Text from a user or a file, shown as text on the page: control characters
    escaped, then `<`, `>`, `&` and quotes."""
    return html.escape(printable(str(text)), quote=True)


def page(
    title: str,
    devices: Sequence[LedgerDevice],
    streams: Sequence[LedgerStream],
    fallbacks: Sequence[FallbackCount],
    transfers: Sequence[TransferSite],
    arrays: int,
) -> str:
    """The HTML picture: see `Ledger.to_html` (`arrays`: the live arrays, each once)."""
    totals = rules(devices)
    nbytes = sum(d.nbytes for d in devices)
    backed = sum(d.file_backed for d in devices)
    colour = {
        (r.origin, r.rule): _UNPLACED_COLOUR if r.origin == UNPLACED else _COLOURS[i % 9]
        for i, r in enumerate(totals)
    }
    label = {(r.origin, r.rule): r.label for r in totals}
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f"<p>{_plural(arrays, 'live array')}, {format_size(nbytes)}"
        + (f" ({format_size(backed)} file-backed)" if backed else "")
        + f" on {_plural(len(devices), 'device')}.</p>",
        "<h2>Devices</h2>",
        '<p class="src">Bytes: the live arrays JAX lists (<code>jax.live_arrays()</code>), '
        "each by the rule that placed it; file-backed bytes found in /proc/self/maps. "
        "Each bar is its device's memory in all where that is measured (its own "
        "scale), else its arrays alone. A rule's share under one pixel still shows.</p>",
    ]
    if not devices:
        out.append('<p class="none">No devices in this ledger.</p>')
    for d in devices:
        out += _device_html(d, colour, label)
    out += _streams_html(streams)
    out += _rules_html(totals, colour)
    out += _fallbacks_html(fallbacks)
    out += _transfers_html(transfers)
    out.append("</body></html>\n")
    return "\n".join(out)


def _device_html(
    d: LedgerDevice,
    colour: dict[tuple[str, int | None], str],
    label: dict[tuple[str, int | None], str],
) -> list[str]:
    parts, whole = _segments(d)
    free = "free memory unknown" if d.free is None else f"{format_size(d.free)} free"
    out = [
        f"<h3>{_e(d.device)} <span class='src'>({_e(d.pool)})</span></h3>",
        f"<div>{_plural(d.arrays, 'array')}, {format_size(d.nbytes)}; {free}</div>",
    ]
    if whole > 0:
        segs = []
        for p, n in parts:
            width = f"{100 * n / whole:.4f}%"
            if isinstance(p, str):
                if not n:
                    continue
                what = "free" if p == "free" else OTHER_USE
                segs.append(
                    f'<div class="seg {p}" style="width:{width}" '
                    f'title="{_e(what)}: {format_size(n)}"></div>'
                )
            elif n > 0:
                key = (p.origin, p.rule)
                segs.append(
                    f'<div class="seg" style="width:{width};background:{colour[key]}" '
                    f'title="{_e(label[key])}: {format_size(n)}"></div>'
                )
        out.append(f'<div class="bar" role="img" aria-label="{_e(d.device)}">{"".join(segs)}</div>')
    rows = []
    for p, n in parts:
        if isinstance(p, str):
            if p == "other" and n:
                rows.append(
                    f'<tr><td><span class="swatch" style="background:#e8e8e8"></span>'
                    f'{_e(OTHER_USE)}</td><td></td><td class="n"></td>'
                    f'<td class="n">{format_size(n)}</td><td></td></tr>'
                )
            continue
        key = (p.origin, p.rule)
        names = _names(p.names, 5)
        rows.append(
            f'<tr><td><span class="swatch" style="background:{colour[key]}"></span>'
            f"{_e(label[key])}</td><td>{_e(names)}</td>"
            f'<td class="n">{_plural(p.arrays, "array")}</td>'
            f'<td class="n">{format_size(n)}</td>'
            f'<td class="n">{format_size(p.file_backed) + " file-backed" if p.file_backed else ""}'
            "</td></tr>"
        )
    if rows:
        out.append(
            '<table><tr><th>rule</th><th>names</th><th class="n">arrays</th>'
            '<th class="n">bytes</th><th class="n"></th></tr>' + "".join(rows) + "</table>"
        )
    else:
        out.append('<p class="none">No live arrays here.</p>')
    out.append(f'<p class="src">{_e(_capacity_text(d))}</p>')
    return out


def _streams_html(listed: Sequence[LedgerStream]) -> list[str]:
    out = [
        "<h2>Streams</h2>",
        '<p class="src">Counted by each stream (<code>windows</code>, <code>prefetch</code>) '
        "as it runs: batches placed and their bytes; batches handed out, seconds the loop "
        "waited inside next() and seconds of its own work between pulls, timed by the "
        "stream. Rate: batches handed out over the seconds from the first pull to the "
        "latest hand-out.</p>",
    ]
    if not listed:
        return [*out, '<p class="none">No streams in this process.</p>']
    rows = []
    for s in listed:
        share = s.waited_share
        drawn = (
            ""
            if share is None
            else f'<span class="wait"><span style="width:{100 * share:.2f}%"></span></span> '
        )
        rows.append(
            f"<tr><td>{_e(s.name)}</td><td>{'open' if s.open else 'ended'}</td>"
            f"<td>{_e(s.device)}</td><td class='n'>{s.batches:,}</td>"
            f"<td class='n'>{format_size(s.nbytes)}</td><td class='n'>{s.handed:,}</td>"
            f"<td>{_e(s.reads or NOT_MEASURED)}</td><td>{_e(s.reads_why or NOT_MEASURED)}</td>"
            f"<td class='n'>{_e(_rate(s))}</td><td>{drawn}{_share(share)}</td></tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "stream",
            "state",
            "device",
            "batches",
            "bytes",
            "handed out",
            "reads",
            "why",
            "rate",
            "waited",
        )
    )
    return [*out, f"<table><tr>{head}</tr>{''.join(rows)}</table>"]


def _rules_html(
    totals: Sequence[RuleTotal], colour: dict[tuple[str, int | None], str]
) -> list[str]:
    out = [
        "<h2>Rules by bytes</h2>",
        '<p class="src">The live arrays of every device by the rule that placed them '
        "(from the same count as the devices above); an array spread over several "
        "devices counts once on each.</p>",
    ]
    if not totals:
        return [*out, '<p class="none">No live arrays.</p>']
    rows = "".join(
        f'<tr><td><span class="swatch" style="background:{colour[r.origin, r.rule]}"></span>'
        f"{_e(r.label)}</td><td class='n'>{_plural(r.arrays, 'array')}</td>"
        f"<td class='n'>{format_size(r.nbytes)}</td><td>{_e(', '.join(r.devices))}</td></tr>"
        for r in totals
    )
    return [
        *out,
        '<table><tr><th>rule</th><th class="n">arrays</th><th class="n">bytes</th>'
        f"<th>devices</th></tr>{rows}</table>",
    ]


def _fallbacks_html(counted: Sequence[FallbackCount]) -> list[str]:
    out = [
        "<h2>Fallbacks taken</h2>",
        '<p class="src">Counted by the decider as it decides, in this process: each '
        "decision whose rule's target could not be had, or could not hold the bytes "
        "(a name decided again from its cache counts once).</p>",
    ]
    if not counted:
        return [*out, '<p class="none">None counted in this process.</p>']
    rows = "".join(
        f"<tr><td>{_e(f.origin)}</td><td>{_e(f.requested)}</td><td>{_e(f.used)}</td>"
        f"<td>{'too small' if f.short else 'not there'}</td>"
        f"<td>{'declared' if f.declared else 'policy chain'}</td>"
        f"<td class='n'>{f.decisions:,}</td><td class='n'>{format_size(f.nbytes)}</td>"
        f"<td>{_e(f.reason)}</td></tr>"
        for f in counted
    )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("rule", "asked", "used", "why", "way", "decisions", "bytes", "latest reason")
    )
    return [*out, f"<table><tr>{head}</tr>{rows}</table>"]


def _transfers_html(transfers: Sequence[TransferSite]) -> list[str]:
    if not transfers:
        return []
    rows = "".join(
        f"<tr><td>{_e(t.site)}</td><td>{_e(t.direction)}</td><td class='n'>{t.count:,}</td>"
        f"<td class='n'>{format_size(t.nbytes)}</td><td>{_e(', '.join(t.devices))}</td></tr>"
        for t in transfers
    )
    return [
        "<h2>Implicit transfers</h2>",
        '<p class="src">Counted while a policy with <code>transfers:</code> watched.</p>',
        '<table><tr><th>site</th><th>direction</th><th class="n">transfers</th>'
        f'<th class="n">bytes</th><th>to</th></tr>{rows}</table>',
    ]


def write_page(text: str, path: str | os.PathLike[str]) -> Path:
    """Write `text` to `path` whole or not at all: a temporary file in the same folder,
    renamed over `path`. A path that cannot be written raises the `OSError` of its
    kind, naming the path and why."""
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise IsADirectoryError(
            errno.EISDIR, "cannot write the report: it is a directory", str(target)
        )
    if not folder.exists():
        raise FileNotFoundError(
            errno.ENOENT,
            f"cannot write the report: its folder {str(folder)!r} does not exist",
            str(target),
        )
    if not folder.is_dir():
        raise NotADirectoryError(
            errno.ENOTDIR, f"cannot write the report: {str(folder)!r} is not a folder", str(target)
        )
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise type(e)(
            e.errno, f"cannot write the report in {str(folder)!r}: {e.strerror}", str(target)
        ) from e
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(temporary, 0o644)  # a page to share, not mkstemp's owner-only 0600
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target
