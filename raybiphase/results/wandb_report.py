"""A sweep's report as a W&B Report (wandb-workspaces), built over the sweep's own W&B runs:

    entity, project = parse_target("lab/study")          # UserError: not ENTITY/PROJECT
    check_wandb(entity)                                 # UserError: no key, or the W&B server out of reach
    report = build_report(sections, entity=entity, project=project, sweep="quickstart", title="Results: quickstart")
    report.save()                                       # what `raybiphase report RESULTS --wandb lab/study` does

The report's blocks follow the Markdown report's sections: pretraining curves as line plots of the sweep's
pretraining runs against tokens seen, fine-tuning scores as scatter plots of its (checkpoint, task) runs, every
drawn figure as a media panel over the sweep's "report" run (which holds it: raybiphase.results.wandb_upload.log_report),
and each section's note and table (the findings, the predictions of arms not launched) as Markdown.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request

from raybiphase.errors import UserError
from raybiphase.telemetry.wandb import WANDB_HOST, api_key

PRETRAIN_LOSSES = ("val/mlm_loss", "val/clm_loss")
TRAIN_LOSSES = ("train/mlm_loss", "train/clm_loss")
KNOBS = ("phases.clm_share", "phases.mask_ratio", "phases.steps")  # the settings the paper's figures vary
PREDICTIONS = ("next_size", "staging")  # the sections that hold predictions


def parse_target(text: str) -> tuple[str, str]:
    """(entity, project) of 'ENTITY/PROJECT'; UserError otherwise."""
    entity, _, project = text.partition("/")
    if not entity or not project or "/" in project:
        raise UserError(f"--wandb: {text!r} is not ENTITY/PROJECT (e.g. --wandb my-lab/my-study)")
    return entity, project


def base_url() -> str:
    return (os.environ.get("WANDB_BASE_URL") or f"https://{WANDB_HOST}").rstrip("/")


def check_wandb(entity: str, timeout: float = 10.0) -> None:
    """UserError, in one line, unless a W&B key is at hand and the W&B server answers within `timeout` seconds."""
    if os.environ.get("WANDB_MODE") in ("offline", "disabled"):
        raise UserError(f"--wandb: WANDB_MODE={os.environ['WANDB_MODE']}; a W&B Report needs the W&B server "
                        "(unset WANDB_MODE)")
    if not api_key():
        raise UserError(f"--wandb: no W&B credentials for entity {entity!r} (run `wandb login` or set "
                        "WANDB_API_KEY)")
    url = base_url()
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return  # the server answered
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise UserError(f"--wandb: the W&B server {url} is out of reach ({reason}); nothing was uploaded") from None


def _runs(wr, entity: str, project: str, sweep: str, kind: str, name: str):
    return wr.Runset(entity=entity, project=project, name=name,
                     filters=f"Metric('Group') == '{sweep}' and Metric('JobType') == '{kind}'")


def _text(section) -> str:
    return "\n\n".join(part for part in (section.note, section.table) if part)


def build_report(sections, *, entity: str, project: str, sweep: str, title: str, intro: str = ""):
    """The W&B Report (a wandb_workspaces Report, not saved) of a sweep's report `sections`
    (raybiphase.results.report.build_sections or write_report's)."""
    import wandb_workspaces.reports.v2 as wr  # lazy: an optional dependency (the `wandb` extra)

    pretraining = _runs(wr, entity, project, sweep, "pretrain", "Pretraining runs")
    finetuning = _runs(wr, entity, project, sweep, "finetune", "Fine-tuning (checkpoint, task)")
    drawn = _runs(wr, entity, project, sweep, "report", "Report")
    blocks = [wr.P(intro)] if intro else []
    blocks += [wr.H2("Pretraining curves against tokens seen"),
               wr.PanelGrid(runsets=[pretraining], panels=[
                   wr.LinePlot(title="Held-out loss", x="tokens_seen", y=list(PRETRAIN_LOSSES)),
                   wr.LinePlot(title="Training loss", x="tokens_seen", y=list(TRAIN_LOSSES), smoothing_factor=0.6)]),
               wr.H2("Fine-tuning: test score at the best LR"),
               wr.PanelGrid(runsets=[finetuning], panels=[
                   wr.ScatterPlot(title=f"test_mean by {knob}", x=wr.Config(knob), y=wr.SummaryMetric("test_mean"))
                   for knob in KNOBS])]
    for section in sections:
        blocks.append(wr.H2(section.title))
        if section.figure is not None:
            blocks.append(wr.PanelGrid(runsets=[drawn], panels=[
                wr.MediaBrowser(title=section.title, media_keys=[f"figures/{section.name}"], num_columns=1)]))
        if text := _text(section):
            blocks.append(wr.MarkdownBlock(text))
    return wr.Report(project=project, entity=entity, title=title[:128], blocks=blocks,
                     description=f"The sweep {sweep}: its W&B runs and the report raybiphase drew from them.")


def publish(sections, *, entity: str, project: str, sweep: str, title: str, intro: str = "") -> str:
    """Save the report on the W&B server; returns its URL. Any failure of the server is one UserError line."""
    report = build_report(sections, entity=entity, project=project, sweep=sweep, title=title, intro=intro)
    try:
        report.save()
    except Exception as error:  # the server's, wandb's or the network's: the report files are already written
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"--wandb: W&B did not save the report ({first}); the local report is kept") from None
    return report.url
