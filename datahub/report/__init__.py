"""The lake report: an HTML page with matplotlib PNGs for one samples table version.

``build_report(lake, out_dir=...)`` is what ``datahub report`` calls; matplotlib is
imported only when plots are drawn. Tables holding ``image_text`` samples get an Images section
(``datahub.report.media``: resolution/aspect histograms, contact sheets of kept images and of the
largest duplicate clusters); other tables have none.
"""

from __future__ import annotations

import html
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datahub.errors import LakeError
from datahub.lake.lake import Lake
from datahub.progress import Progress
from datahub.report.data import ReportData, collect


@dataclass
class Report:
    index: Path
    plots: dict[str, Path] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # section -> why it has no plot

    def as_dict(self) -> dict[str, Any]:
        return {"index": str(self.index), "plots": {k: str(v) for k, v in self.plots.items()}, "notes": self.notes}


SECTIONS = (
    ("signals", "Quality signal distributions", "no numeric quality signals in this table (no quality operators ran)"),
    ("drops", "Drop reasons per operator", "no samples were dropped by the runs that wrote this version"),
    ("languages", "Language mix", "no `quality.language` signal (add the language_id operator)"),
    ("clusters", "Duplicate clusters by size", "no dedup drops with a dup_of / cluster_id reference in lineage"),
    ("sources", "Samples per source file", "no source_uri column"),
)

# The Images section (tables with image_text samples only): plot key -> caption.
MEDIA_SECTIONS = (
    ("image_sizes", "Resolution and aspect ratio"),
    ("contact_sheet", "Contact sheet: kept images"),
    ("duplicate_clusters", "Contact sheet: keepers of the largest duplicate clusters (xN = cluster size)"),
)

# Marks the page once every image decoded, so a headless browser check can read the DOM.
_IMAGE_CHECK = """<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  var p = document.getElementById('image-check');
  p.textContent = 'images-loaded ' + ok + '/' + imgs.length;
  p.setAttribute('data-loaded', String(ok));
  p.setAttribute('data-total', String(imgs.length));
});
</script>"""


def build_report(lake: Lake, *, out_dir: str | Path, table: str = "samples", version: int | None = None,
                 progress: Progress | None = None) -> Report:
    """Write ``out_dir/index.html`` plus one PNG per section that has data; ``progress(stage, done, total)``
    follows the pass over the table's rows."""
    from datahub.report import plots
    from datahub.report.media import media_plots

    if table == "samples" and version is None and not lake.exists(table) and lake.exists("quarantine"):
        # the runs so far wrote no sample: say where the records went, not only that the table is missing
        quarantined = lake.dataset("quarantine").count_rows()  # from the files' footers
        raise LakeError(f"{lake.table_uri(table)}: no sample was written to lake {lake.root} yet ({quarantined} records "
                        f"quarantined); see why: datahub quarantine --lake {shlex.quote(lake.ref)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = collect(lake, table=table, version=version, progress=progress)
    drawn = {
        "signals": plots.signal_histograms(data.signals, out / "signals.png"),
        "drops": plots.bar_chart(data.drops, out / "drops.png", title="dropped samples by operator / reason"),
        "languages": plots.bar_chart(data.languages, out / "languages.png", title="language (langid)"),
        "clusters": plots.cluster_size_histogram(data.cluster_sizes, out / "clusters.png"),
        "sources": plots.bar_chart(data.sources, out / "sources.png", title="samples per source file"),
    }
    report = Report(out / "index.html")
    for key, _, missing in SECTIONS:
        path = drawn[key]
        if path is not None:
            report.plots[key] = path
        else:
            report.notes[key] = missing
    report.plots.update(media_plots(lake, out_dir=out, table=table, version=data.version))
    report.index.write_text(_render(lake, data, report))
    return report


def _render(lake: Lake, data: ReportData, report: Report) -> str:
    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>datahub report: {esc(data.table)}@{data.version}</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}img{max-width:100%}"
        "td,th{padding:2px 8px;text-align:left}.fail{color:#b00}.ok{color:#070}</style></head><body>",
        f"<h1>{esc(data.table)} v{data.version}</h1>",
        f"<p>lake <code>{esc(lake.root)}</code>: {data.rows} samples, {sum(data.drops.values())} dropped "
        f"by the runs that wrote them.</p><p id='image-check'>images not checked</p>",
    ]
    for key, title, _ in SECTIONS:
        parts.append(f"<h2 id='{key}'>{esc(title)}</h2>")
        if key in report.plots:
            parts.append(f"<img id='plot-{key}' src='{report.plots[key].name}' alt='{esc(title)}'>")
        else:
            parts.append(f"<p class='note' id='note-{key}'>{esc(report.notes[key])}</p>")
    media = [(key, caption) for key, caption in MEDIA_SECTIONS if key in report.plots]
    if media:
        parts.append("<h2 id='images'>Images</h2>")
        for key, caption in media:
            parts.append(f"<h3>{esc(caption)}</h3><img id='plot-{key}' src='{report.plots[key].name}' alt='{esc(caption)}'>")
    parts.append("<h2 id='quarantine'>Quarantine</h2>")
    if data.quarantine:
        parts.append(f"<p>{sum(data.quarantine.values())} records quarantined by the runs that wrote this table; "
                     f"examples: <code>datahub quarantine --lake {esc(shlex.quote(str(lake.root)))}</code></p>")
        parts.append("<table><tr><th>reason</th><th>records</th></tr>")
        for reason, n in data.quarantine.most_common():
            parts.append(f"<tr><td>{esc(str(reason))}</td><td>{n}</td></tr>")
        parts.append("</table>")
    else:
        parts.append("<p class='note' id='note-quarantine'>no record was quarantined by the runs that wrote this table</p>")
    parts.append("<h2 id='qa'>QA suites</h2>")
    if data.qa:
        parts.append("<table><tr><th>suite</th><th>result</th><th>failed expectations</th></tr>")
        for r in data.qa:
            failed = ", ".join(f"{e['expectation']}({e['kwargs'].get('column', '')})" for e in r.failed_expectations)
            cls, word = ("ok", "passed") if r.success else ("fail", "FAILED")
            parts.append(f"<tr><td>{esc(r.suite)}</td><td class='{cls}'>{word}</td><td>{esc(failed)}</td></tr>")
        parts.append("</table>")
    else:
        parts.append("<p class='note'>no QA results recorded for this version (run <code>datahub qa</code>)</p>")
    parts.append(_IMAGE_CHECK + "</body></html>")
    return "\n".join(parts)


__all__ = ["Report", "ReportData", "build_report", "collect"]
