"""The report as one self-contained HTML file (report.html beside report.md): every figure inline as SVG (vector,
no files beside it), tables and notes rendered from the same Markdown, and a header naming the spec, the code
version, the date and the hardware, so the file can be mailed or attached as it is.

    html = render(title, header={"spec": ..., "code": ..., "date": ..., "hardware": ...}, intro=lines,
                  sections=sections)

The header comes from <sweep>/sweep.json, which the sweep writes when it starts (`run_info`); a results folder
without one (imported rows only) names the machine that drew the report.
"""

from __future__ import annotations

import datetime
import html
import io
import os
import platform

from raybiphase import storage
from raybiphase.config.sweep import UNMEASURED_SD, check_unmeasured_sd
from raybiphase.telemetry.provenance import code_version

STYLE = """
body { font: 15px/1.5 system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
th { background: #f3f3f3; }
dl.header { display: grid; grid-template-columns: max-content auto; gap: 2px 1em; background: #f7f7f7;
            padding: 0.8em 1em; border-radius: 6px; }
dl.header dt { font-weight: 600; }
dl.header dd { margin: 0; font-family: ui-monospace, monospace; }
figure { margin: 1em 0; }
figure svg { max-width: 100%; height: auto; }
"""


def hardware() -> str:
    """What the sweep runs on: Ray's cluster when it is up (nodes, CPUs, GPUs and their model), else this machine."""
    cpus, gpus, nodes = os.cpu_count() or 0, 0, 1
    try:
        import ray

        if ray.is_initialized():
            alive = [n for n in ray.nodes() if n.get("Alive")]
            nodes = len(alive)
            cpus = int(sum(n["Resources"].get("CPU", 0) for n in alive))
            gpus = int(sum(n["Resources"].get("GPU", 0) for n in alive))
    except Exception:  # hardware is a description: never a reason to fail
        pass
    text = f"{nodes} node(s), {cpus} CPUs, {gpus} GPUs ({platform.machine()}, {platform.system()})"
    try:
        import torch

        if torch.cuda.is_available():
            text += f"; driver's GPU: {torch.cuda.get_device_name()}"
    except Exception:
        pass
    return text


def protocol(finetune) -> str:
    """The fine-tuning protocol's choices that move scores (a FinetuneConfig), said in the report's header."""
    labels = ("every sub-token of a word labelled, words predicted by their sub-tokens' majority vote"
              if finetune.tc_labels == "all_subtokens" else "first sub-token of each word only")
    return (f"token classification: {labels} (finetune.tc_labels={finetune.tc_labels}); best LR over the LRs whose "
            f"every seed scored, a diverged seed at the metric's floor; QA windows without the answer point at 0; "
            f"inputs up to {finetune.max_len} tokens")


def run_info(spec_path: str = "", finetune=None, unmeasured_sd: float | None = None) -> dict:
    """The header of a sweep's report, recorded at its start (with the fine-tuning protocol when given), and the
    report's settings from the spec: sweep.unmeasured_sd when given (`unmeasured_sd_of` reads it back)."""
    return {"spec": spec_path, "code": code_version(), "hardware": hardware(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            **({"protocol": protocol(finetune)} if finetune is not None and finetune.tasks else {}),
            **({"unmeasured_sd": unmeasured_sd} if unmeasured_sd is not None else {})}


def unmeasured_sd_of(results_dir: str) -> float:
    """The sweep.unmeasured_sd a results folder's sweep.json records, else its default (a recorded value below 1
    or not a number: a ConfigError naming it)."""
    recorded = (storage.read_json(storage.join(results_dir, storage.RUN_INFO)) or {}).get("unmeasured_sd")
    if recorded is None:
        return UNMEASURED_SD
    check_unmeasured_sd(recorded, f"{storage.RUN_INFO} unmeasured_sd (sweep.unmeasured_sd)")
    return float(recorded)


def header_of(results_dir: str) -> dict:
    """The recorded header of a results folder, with this drawing's date; else one describing this machine."""
    recorded = storage.read_json(storage.join(results_dir, storage.RUN_INFO)) or {}
    drawn = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return {"spec": recorded.get("spec") or "(none recorded: rows imported or written elsewhere)",
            "code": recorded.get("code") or code_version(),
            "run started": recorded.get("date", ""), "report drawn": drawn,
            "hardware": recorded.get("hardware") or hardware(), "protocol": recorded.get("protocol", "")}


def _markdown(text: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").render(text)


def svg(figure) -> str:
    """A matplotlib figure as an SVG document, its text kept as text (selectable on the page, editable in a vector
    editor, in the reader's fonts)."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        figure.savefig(buffer, format="svg")
    return buffer.getvalue()


def render(title: str, *, header: dict, intro: list[str], sections: list, svgs: dict[str, str] | None = None) -> str:
    """The whole page. `sections`: raybiphase.results.tables.Section (figure, note, table); `svgs`: their figures'
    SVG documents by section name, where drawn already (else drawn here)."""
    parts = [f"<h1>{html.escape(title)}</h1>", '<dl class="header">']
    parts += [f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(v))}</dd>" for k, v in header.items() if v]
    parts += ["</dl>", _markdown("\n".join(intro))]
    for number, section in enumerate(sections, 1):
        parts.append(f'<h2 id="{html.escape(section.name)}">{number}. {html.escape(section.title)}</h2>')
        if section.figure is None:
            parts.append(_markdown(f"_{section.note}_"))
        else:
            document = (svgs or {}).get(section.name) or svg(section.figure)
            parts += [f"<figure>{document[document.index('<svg'):]}</figure>", _markdown(section.note)]
        if section.table:
            parts.append(_markdown(section.table))
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n")
