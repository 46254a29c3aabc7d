"""`alcli inspect`: the model's modules, the gradient rule serving each, and the engine method."""
from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import shared
from .options import (
    INPUT, Arch, ArchKwargs, Config, Ema, LabelsFromFolders, Layers, Method, Model, Task, Trust,
    TrustRemoteCode)

EPILOG = """Examples:

\b
alcli inspect                      # the demo model
alcli inspect -m ckpt.pt --arch torchvision:resnet18 --layers 'layer4.*'
"""


def inspect(
    config: Config = None, model: Model = None, arch: Arch = None, trust_checkpoint: Trust = False,
    trust_remote_code: TrustRemoteCode = False, arch_kwargs: ArchKwargs = None, ema: Ema = False,
    pool: Annotated[Optional[str], typer.Option(
        metavar="POOL", help="A pool to try the engine on, to see which method auto picks.",
        rich_help_panel=INPUT)] = None,
    labels_from_folders: LabelsFromFolders = False, layers: Layers = None, method: Method = None,
    task: Task = None,
):
    """Show the model's modules, parameter counts, which gradient rule serves each selected
    module, and which engine method auto will use."""
    flags = dict(locals())
    settings = shared.settings_from(flags.pop("config"), flags)
    info = shared.api().inspect_model(settings)
    table = Table(title=Text(f"{info.model}: {info.total_params:,} parameters, "
                             f"{info.selected_params:,} selected"), title_justify="left")
    for c in ("module", "type", "params", "selected", "rule"):
        table.add_column(c, justify="right" if c == "params" else "left")
    for m in info.modules:
        table.add_row(*map(Text, (m.name, m.kind, f"{m.params:,}", "yes" if m.selected else "no",
                                  m.rule if m.selected else "")))
    console = Console(highlight=False, soft_wrap=True)
    console.print(table)
    console.print(f"input channels: {info.channels if info.channels else 'unknown (no convolution)'}",
                  markup=False)
    reason = info.reason or ""
    if reason.startswith(f"{info.method}: "):
        reason = reason[len(info.method) + 2:]
    console.print(f"task: {info.task}", markup=False)
    if info.default_strategy is not None:
        console.print(f"default strategy: {info.default_strategy} (when --strategy is not given; "
                      f"the rule in docs/benchmarks.md)", markup=False)
    console.print(f"method: {info.method}" + (f" ({reason})" if reason else ""), markup=False)
