"""Figures from run data. Every function takes data and returns a ``matplotlib.figure.Figure``.

No I/O and no pyplot state: figures are built with ``Figure()`` directly, so they work with the
Agg backend, in tests, and in a notebook (where IPython renders a returned Figure inline).

Axis labels, legends and short titles stay English in every edition; the Chinese edition's glosses of notes,
sentence-like titles and the loss legend's key (``LOSS_LEGEND_TITLE``) are ``figure_text``'s. Legends stand outside
the axes, never over the data, and a step axis has whole-number ticks (``figure_text``: ``legend_outside``,
``step_axis``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from ..i18n import N_
from .figure_text import gloss, legend_outside, set_title, step_axis

MIB = 2**20
# The loss panel's legend key: which line is a rank's own loss and which the mean over the ranks (glossed in Chinese).
LOSS_LEGEND_TITLE = N_("local: a rank's loss on its own samples\nglobal: the mean of all ranks' losses")


def _figure(ncols: int = 1, width_in: float = 5.0, height_in: float = 3.4) -> tuple[Figure, list]:
    fig = Figure(figsize=(width_in * ncols, height_in), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def draw_loss(ax, metrics: pd.DataFrame) -> None:
    """Draw each rank's local loss, ``loss_local`` (solid), and the mean over the ranks, ``loss_global`` (dashed
    black), against step; the legend's key (``LOSS_LEGEND_TITLE``) says which is which."""
    marker = "o" if metrics["step"].nunique() < 10 else None  # a short run's few points stay visible
    for rank, df in metrics.groupby("rank"):
        ax.plot(df["step"], df["loss_local"], lw=1.2, marker=marker, label=f"rank {rank} local (loss_local)")
    if "loss_global" in metrics:
        g = metrics.groupby("step")["loss_global"].first()
        ax.plot(g.index, g.values, "k--", lw=1.5, marker=marker, label="global (loss_global)")
    step_axis(ax, metrics["step"])
    ax.set_ylabel("loss")
    ax.set_title("loss per rank")
    legend_outside(ax, LOSS_LEGEND_TITLE if "loss_global" in metrics else "")


TENSOR_BYTES = {"param_bytes": "parameters", "grad_bytes": "gradients", "optimizer_state_bytes": "optimizer state",
                "activation_bytes": "activations (saved for backward)"}


def draw_tensor_bytes(ax, metrics: pd.DataFrame) -> None:
    """Stack what one rank holds per step: parameters, gradients, optimizer state, saved activations (MiB).

    Rank 0's parts are stacked; every other rank's total is a dashed line (equal under DDP, shards under FSDP).
    The columns are the exact tensor bytes the training scripts log each step (``*_bytes`` metrics); a column a
    script does not log is left out.
    """
    columns = [c for c in TENSOR_BYTES if c in metrics.columns and metrics[c].notna().any()]
    by_rank = {rank: df.sort_values("step") for rank, df in metrics.groupby("rank")}
    first = min(by_rank)
    df = by_rank[first]
    ax.stackplot(df["step"], *[df[c].fillna(0) / MIB for c in columns], labels=[TENSOR_BYTES[c] for c in columns],
                 alpha=0.8)
    for rank, other in by_rank.items():
        if rank != first:
            ax.plot(other["step"], other[columns].fillna(0).sum(axis=1) / MIB, ls="--", lw=1, color="black",
                    label=f"rank {rank} total")
    step_axis(ax, df["step"])
    ax.set_ylabel("MiB")
    ax.set_title(f"tensor memory per rank (rank {first} stacked)")
    legend_outside(ax, fontsize=7)


def draw_memory(ax, samples: pd.DataFrame | None = None, metrics: pd.DataFrame | None = None,
                notes: Sequence[str] | None = None) -> None:
    """Draw memory per rank against time: GPU memory per process when sampled, else RSS.

    Without samples, the per-step memory in ``metrics`` (``peak_allocated_bytes`` on CUDA,
    ``rss_bytes`` on CPU) is drawn against step instead. ``notes`` (default: ``samples.attrs["notes"]``,
    which ``read_memory_samples`` sets) are written in red inside the axes: e.g. that no worker process
    matched NVML's process list, so the curves are RSS and GPU memory is known per device only.
    """
    if notes is None and samples is not None:
        notes = samples.attrs.get("notes")
    if notes:
        glossed = [gloss(note, 70) for note in notes]
        props = next((p for _text, p in glossed if p), {})
        ax.text(0.02, 0.98, "\n".join(text for text, _props in glossed), transform=ax.transAxes,
                va="top", ha="left", fontsize=7, color="#b71c1c", **props)
    on_gpu = samples is not None and "gpu_used_bytes" in samples and samples["gpu_used_bytes"].notna().any()
    if not on_gpu and metrics is not None and len(metrics) and {"param_bytes", "grad_bytes"} <= set(metrics.columns):
        draw_tensor_bytes(ax, metrics)  # on CPU, RSS is mostly `import torch`: show what the lesson is about
        return
    if samples is not None and len(samples):
        column = "gpu_used_bytes" if on_gpu else "rss_bytes"
        for rank, df in samples.groupby("rank"):
            ax.plot(df["time_s"], df[column] / MIB, lw=1.2, label=f"rank {rank}")
        ax.set_xlabel("time since launch (s)")
        ax.set_ylabel(("GPU memory" if column == "gpu_used_bytes" else "RSS") + " (MiB)")
        ax.set_title("memory per " + ("GPU process" if column == "gpu_used_bytes" else "rank (process RSS)"))
    elif metrics is not None and len(metrics) and ({"peak_allocated_bytes", "rss_bytes"} & set(metrics.columns)):
        column = "peak_allocated_bytes" if "peak_allocated_bytes" in metrics else "rss_bytes"
        for rank, df in metrics.groupby("rank"):
            ax.plot(df["step"], df[column] / MIB, lw=1.2, label=f"rank {rank}")
        step_axis(ax, metrics["step"])
        ax.set_ylabel(f"{column.removesuffix('_bytes')} (MiB)")
        ax.set_title("memory per rank")
    else:
        ax.set_title("memory per rank (no memory data)")
        return
    legend_outside(ax)


def plot_loss(metrics: pd.DataFrame) -> Figure:
    """Loss per rank vs step, with the global mean. ``metrics`` as from ``read_metrics``."""
    fig, (ax,) = _figure()
    draw_loss(ax, metrics)
    return fig


def plot_memory(samples: pd.DataFrame | None = None, metrics: pd.DataFrame | None = None,
                notes: Sequence[str] | None = None) -> Figure:
    """Memory per rank (per GPU process on CUDA) vs time, with the sampler's notes; see ``draw_memory``."""
    fig, (ax,) = _figure()
    draw_memory(ax, samples, metrics, notes)
    return fig


def plot_run(metrics: pd.DataFrame, samples: pd.DataFrame | None = None, notes: Sequence[str] | None = None) -> Figure:
    """Loss (left) and memory (right) of one run side by side: the figure the live view redraws.

    ``notes``: see ``draw_memory`` (default: those ``read_memory_samples`` attached to ``samples``).
    """
    fig, (ax_loss, ax_mem) = _figure(ncols=2, width_in=6.0)  # each legend stands right of its panel
    if len(metrics):
        draw_loss(ax_loss, metrics)
    else:
        ax_loss.set_title("loss per rank (no data yet)")
    draw_memory(ax_mem, samples, metrics, notes)
    return fig


def plot_tensor_bytes(metrics: pd.DataFrame) -> Figure:
    """Stacked bars per rank of the bytes held by parameters, gradients and optimizer state (last step)."""
    last = metrics.sort_values("step").groupby("rank").last()
    fig, (ax,) = _figure()
    bottom = pd.Series(0.0, index=last.index)
    for column, label in [("param_bytes", "parameters"), ("grad_bytes", "gradients"),
                          ("optimizer_state_bytes", "optimizer state")]:
        values = last[column] / MIB
        ax.bar([f"rank {r}" for r in last.index], values, bottom=bottom, label=label)
        bottom += values
    ax.set_ylabel("MiB")
    ax.set_title("tensor memory per rank (exact bytes)")
    legend_outside(ax)
    return fig


def plot_compare(runs: Mapping[str, pd.DataFrame], y: str = "loss_global", x: str = "step") -> Figure:
    """Overlay one column of several runs: ``runs`` maps a label to that run's metrics table.

    Rank 0's rows are used (``loss_global`` is the same on every rank).
    """
    fig, (ax,) = _figure()
    for label, df in runs.items():
        d = df[df["rank"] == df["rank"].min()]
        ax.plot(d[x], d[y], lw=1.4, label=label)
    if x == "step":
        step_axis(ax, pd.concat([df[x] for df in runs.values()]) if runs else [])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    legend_outside(ax)
    return fig


def plot_bandwidth(bandwidth: pd.DataFrame) -> Figure:
    """all_reduce bus bandwidth (GB/s) against message size, log-log; columns as collectives_check writes."""
    fig, (ax,) = _figure()
    ax.loglog(bandwidth["size_bytes"], bandwidth["busbw_GBps"], "o-")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("all_reduce bandwidth")
    ax.grid(True, which="both", alpha=0.3)
    return fig


def plot_index_assignment(assignment: pd.DataFrame, title: str = "") -> Figure:
    """Which rank received which sample, one panel per epoch.

    Args:
        assignment: one row per (epoch, rank, position) with the sample ``index`` that rank got at that
            position (columns ``epoch, rank, position, index``).
        title: figure title.

    A sample index on two ranks in one epoch (padding) shows as two markers in one column; a missing
    column is a sample nobody saw that epoch (``drop_last``).
    """
    epochs = sorted(assignment["epoch"].unique())
    fig, axes = _figure(ncols=len(epochs), width_in=4.0, height_in=2.4)
    n = int(assignment["index"].max()) + 1
    for ax, epoch in zip(axes, epochs):
        df = assignment[assignment["epoch"] == epoch]
        for rank, d in df.groupby("rank"):
            ax.scatter(d["index"], d["rank"], s=60, label=f"rank {rank}")
            for _, row in d.iterrows():  # the order in which the rank sees its samples
                ax.annotate(str(int(row["position"])), (row["index"], row["rank"]), fontsize=6, ha="center",
                            va="center", color="white")
        ax.set_xticks(range(n))
        ax.set_yticks(sorted(df["rank"].unique()))
        ax.set_xlabel("sample index")
        ax.set_ylabel("rank")
        ax.set_title(f"epoch {epoch}")
    if title:
        text, props = gloss(title)
        fig.suptitle(text, **props)
    return fig


def plot_loss_scale(metrics: pd.DataFrame, title: str = "") -> Figure:
    """The gradient scaler's loss scale per step (log scale) with skipped steps marked.

    ``metrics`` needs ``step``, ``loss_scale`` and ``step_skipped`` (``ddp_train.py`` writes them);
    rank 0's rows are drawn (the scaler decides the same on every rank: DDP's gradients are identical).
    """
    fig, (ax,) = _figure()
    d = metrics[metrics["rank"] == metrics["rank"].min()].sort_values("step")
    ax.semilogy(d["step"], d["loss_scale"], lw=1.4, marker=".", base=2, label="loss scale")
    skipped = d[d["step_skipped"].astype(bool)]
    ax.scatter(skipped["step"], skipped["loss_scale"], color="tab:red", marker="x", zorder=3,
               label=f"skipped (inf/NaN gradients): {len(skipped)}")
    step_axis(ax, d["step"])
    ax.set_ylabel("loss scale")
    set_title(ax, title, fontsize=9)
    legend_outside(ax)
    return fig


def plot_memory_prediction(table: pd.DataFrame, title: str = "state per rank: predicted vs measured") -> Figure:
    """Bars of predicted and measured bytes per rank, side by side, one pair per row of ``table``.

    Args:
        table: one row per (run, rank) with columns ``label`` (e.g. ``"DDP N=2 rank 0"``), ``predicted_bytes``
            and ``measured_bytes`` (bytes of parameters + gradients + optimizer state).
        title: axes title.
    """
    fig, (ax,) = _figure(width_in=max(5.0, 1.1 * len(table)) + 2.0)  # the legend stands right of the bars
    x = range(len(table))
    ax.bar([i - 0.2 for i in x], table["predicted_bytes"] / MIB, width=0.4, label="predicted (analytic model)",
           color="lightgray", edgecolor="black")
    ax.bar([i + 0.2 for i in x], table["measured_bytes"] / MIB, width=0.4, label="measured (exact tensor bytes)")
    ax.set_xticks(list(x))
    ax.set_xticklabels(table["label"], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("MiB")
    set_title(ax, title)
    legend_outside(ax)
    return fig


def plot_tradeoff(table: pd.DataFrame, x: str, y: str, label: str = "label", xlabel: str = "", ylabel: str = "",
                  title: str = "") -> Figure:
    """One labelled point per row of ``table``: e.g. activation memory (``x``) against step time (``y``).

    Columns ending in ``_bytes`` are drawn in MiB; both axes start at zero (for non-negative quantities).
    ``label`` names the column that labels each point.
    """
    fig, (ax,) = _figure()
    xs = table[x] / MIB if x.endswith("_bytes") else table[x]
    ys = table[y] / MIB if y.endswith("_bytes") else table[y]
    ax.scatter(xs, ys, s=50)
    for xv, yv, text in zip(xs, ys, table[label]):
        ax.annotate(str(text), (xv, yv), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_xlabel(xlabel or (f"{x.removesuffix('_bytes')} (MiB)" if x.endswith("_bytes") else x))
    ax.set_ylabel(ylabel or (f"{y.removesuffix('_bytes')} (MiB)" if y.endswith("_bytes") else y))
    set_title(ax, title)
    ax.margins(0.25)
    ax.set_xlim(left=0)  # both axes from zero (bytes and seconds): a small difference is not drawn as a large one
    ax.set_ylim(bottom=0)
    return fig


def plot_resume(metrics: pd.DataFrame, reference: pd.DataFrame | None = None, title: str = "") -> Figure:
    """Global loss of a run that resumed or restarted, one segment per attempt, over an uninterrupted run.

    Args:
        metrics: ``read_metrics`` of the run, with ``attempt`` and ``resumed_from_step`` columns (as
            ``checkpoint_train.py`` writes); rank 0's rows are drawn.
        reference: optional metrics of the uninterrupted run, drawn as a thick grey line underneath.
        title: axes title.

    Each (attempt, resumed_from_step) segment gets its own colour and marker; a dotted vertical line marks
    the step a segment resumed from, so steps replayed after a crash show up as two markers on one step.
    """
    fig, (ax,) = _figure(width_in=6.0)
    if reference is not None:
        r = reference[reference["rank"] == reference["rank"].min()]
        ax.plot(r["step"], r["loss_global"], color="0.75", lw=5, label="uninterrupted run", zorder=1)
    d = metrics[metrics["rank"] == metrics["rank"].min()]
    for n, ((attempt, resumed), seg) in enumerate(d.groupby(["attempt", "resumed_from_step"], sort=True)):
        label = f"attempt {attempt}" + (f", resumed from step {resumed}" if resumed else "")
        ax.plot(seg["step"], seg["loss_global"], marker="ox^s"[n % 4], ms=6, lw=1.2, label=label, zorder=2 + n)
        if resumed:
            ax.axvline(resumed, color=ax.lines[-1].get_color(), ls=":", lw=1.2)
    step_axis(ax, d["step"])
    ax.set_ylabel("global loss")
    set_title(ax, title or "loss across attempts")
    legend_outside(ax)
    return fig


TIMELINE_COLORS = {"forward": "#1f77b4", "backward": "#ff7f0e", "optimizer": "#2ca02c", "all-reduce": "#d62728",
                   "other collective": "#7f7f7f"}


def plot_timeline(intervals: pd.DataFrame, overlaps: pd.DataFrame | None = None, title: str = "") -> Figure:
    """Each rank's profiled steps against time: compute on one row, communication on the row below.

    Args:
        intervals: ``read_trace_intervals`` (optionally filtered to some steps): columns ``rank``, ``phase``,
            ``lane`` (``"compute"`` / ``"communication"``), ``start_ms``, ``end_ms``.
        overlaps: optional ``overlap_intervals`` (columns ``rank``, ``start_ms``, ``end_ms``): hatched in black on
            the communication row, where an all-reduce ran while backward computed.
        title: axes title.

    Forward, backward and optimizer bars are coloured by phase on the compute row; all-reduces (red) and other
    collectives (grey) on the communication row. Bars that overlap on one row (two gloo threads) are translucent.
    """
    ranks = sorted(intervals["rank"].unique())
    fig, (ax,) = _figure(width_in=10.0, height_in=1.0 + 0.9 * len(ranks))
    rows = {(rank, lane): 2 * i + (lane == "communication") for i, rank in enumerate(ranks)
            for lane in ("compute", "communication")}
    for (rank, lane, phase), df in intervals.groupby(["rank", "lane", "phase"]):
        y = rows[(rank, lane)]
        ax.broken_barh(list(zip(df["start_ms"], df["end_ms"] - df["start_ms"])), (y - 0.38, 0.76),
                       facecolors=TIMELINE_COLORS.get(phase, "black"), alpha=0.75, label=phase)
    if overlaps is not None and len(overlaps):
        for rank, df in overlaps.groupby("rank"):
            y = rows[(rank, "communication")]
            ax.broken_barh(list(zip(df["start_ms"], df["end_ms"] - df["start_ms"])), (y - 0.45, 0.9),
                           facecolors="none", edgecolors="black", hatch="////", lw=0.8,
                           label="all-reduce during backward")
    found = {artist.get_label(): artist for artist in ax.collections}
    handles = {label: found[label] for label in [*TIMELINE_COLORS, "all-reduce during backward"] if label in found}
    ax.legend(handles.values(), handles.keys(), fontsize=8, ncol=min(6, len(handles)), loc="upper center",
              bbox_to_anchor=(0.5, -0.28))
    ax.set_yticks(list(rows.values()), [f"rank {rank} {lane}" for rank, lane in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms) from the first recorded step")
    set_title(ax, title or "profiled steps per rank")
    return fig


KIB = 2**10


def plot_reshard_tradeoff(table: pd.DataFrame, unsharded_bytes: float, title: str = "") -> Figure:
    """``reshard_after_forward`` settings side by side: the parameter bytes a rank holds between forward and backward
    against the all-gathers each step issues (FSDP2's memory-for-communication trade).

    Args:
        table: one row per setting, indexed by its label (``"True"``, ``"False"``, ``"2"``, ...), columns
            ``held_bytes`` (parameter bytes a rank holds between forward and backward) and ``all_gathers`` (a
            mapping {group size: all-gathers per step}; an int setting's backward all-gathers run in smaller groups).
        unsharded_bytes: the whole model's parameter bytes, drawn as a dashed line on the left panel.
        title: the figure's title.

    Left: held bytes per setting (KiB) under the unsharded model's; right: all-gathers per step, stacked by the size
    of the group they ran in (one colour per group size).
    """
    fig, (held, gathers) = _figure(ncols=2, width_in=4.6)
    labels = [str(label) for label in table.index]
    x = range(len(labels))
    held.bar(x, table["held_bytes"] / KIB, color="#1f77b4")
    held.axhline(unsharded_bytes / KIB, color="black", ls="--", lw=1, label="whole model (unsharded)")
    held.set_ylabel("KiB held between forward and backward")
    held.set_ylim(0, unsharded_bytes / KIB * 1.35)
    held.legend(fontsize=8, loc="upper left")
    sizes = sorted({int(size) for counts in table["all_gathers"] for size in counts}, reverse=True)
    bottom = [0] * len(labels)
    for size in sizes:
        counts = [int({int(k): v for k, v in c.items()}.get(size, 0)) for c in table["all_gathers"]]
        gathers.bar(x, counts, bottom=bottom, label=f"in groups of {size} ranks")
        bottom = [b + c for b, c in zip(bottom, counts)]
    gathers.yaxis.set_major_locator(MaxNLocator(integer=True))
    gathers.set_ylim(0, max(bottom) * 1.35)
    gathers.set_ylabel("all-gathers per step")
    gathers.legend(fontsize=8, loc="upper left")
    for ax in (held, gathers):
        ax.set_xticks(list(x), labels)
        ax.set_xlabel("reshard_after_forward")
    text, props = gloss(title or "reshard_after_forward: memory held against all-gathers")
    fig.suptitle(text, fontsize=10, **props)
    return fig


def plot_mesh(ranks: pd.DataFrame, shard_label: str = "", replicate_label: str = "", title: str = "") -> Figure:
    """A 2-D ``DeviceMesh`` ``("replicate", "shard")`` as a grid: one box per rank at its mesh coordinate.

    Args:
        ranks: one row per rank, columns ``rank``, ``mesh_coordinate`` (``(row, column)``: the replicate index and
            the shard index) and ``holds`` (text: what the rank stores, e.g. ``"rows 0-31"``).
        shard_label: what each row's group (a *shard group*: the ranks that together hold one full copy) runs,
            e.g. ``"all-gather, reduce-scatter"``; written along every row.
        replicate_label: what each column's group (a *replicate group*: the ranks holding the same shard) runs,
            e.g. ``"all-reduce"``; written along every column.
        title: axes title.

    Boxes of one column share a colour: the same shard. Raises ValueError when two ranks share a coordinate.
    """
    coords = [tuple(c) for c in ranks["mesh_coordinate"]]
    if len(set(coords)) != len(coords):
        raise ValueError(f"two ranks at one mesh coordinate: {coords}")
    n_rows, n_cols = max(r for r, _ in coords) + 1, max(c for _, c in coords) + 1
    fig, (ax,) = _figure(width_in=2.6 * n_cols + 2.2, height_in=1.5 * n_rows + 1.2)
    colors = ["#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94"]
    for (row, col), rank, holds in zip(coords, ranks["rank"], ranks["holds"]):
        ax.add_patch(Rectangle((col + 0.08, row + 0.1), 0.84, 0.8, facecolor=colors[col % len(colors)],
                               edgecolor="black", lw=1))
        ax.text(col + 0.5, row + 0.5, f"rank {rank}\n{holds}", ha="center", va="center", fontsize=8)
    link = {"arrowstyle": "<->", "color": "0.3", "lw": 1.4, "shrinkA": 0, "shrinkB": 0}
    for row in range(n_rows):  # a shard group: the ranks of one row
        for col in range(n_cols - 1):
            ax.annotate("", (col + 1.08, row + 0.5), (col + 0.92, row + 0.5), arrowprops=link)
        ax.text(n_cols + 0.05, row + 0.5, f"shard group {row}:\n{shard_label}", va="center", fontsize=8)
    for col in range(n_cols):  # a replicate group: the ranks of one column
        for row in range(n_rows - 1):
            ax.annotate("", (col + 0.5, row + 1.1), (col + 0.5, row + 0.9), arrowprops={**link, "ls": "--"})
        ax.text(col + 0.5, n_rows + 0.05, f"replicate group {col}:\n{replicate_label}", ha="center", va="top",
                fontsize=8)
    ax.set_xlim(0, n_cols + 1.3)
    ax.set_ylim(n_rows + 0.55, 0)  # row 0 on top, as the mesh prints
    ax.set_xticks([c + 0.5 for c in range(n_cols)], [f"shard index {c}" for c in range(n_cols)])
    ax.set_yticks([r + 0.5 for r in range(n_rows)], [f"replicate index {r}" for r in range(n_rows)])
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    set_title(ax, title or f"DeviceMesh {n_rows} x {n_cols} (replicate, shard)")
    return fig


PIPELINE_COLORS = {"F": "#1f77b4", "B": "#ff7f0e"}


def plot_pipeline_timeline(events: pd.DataFrame, unit: str = "slot", title: str = "") -> Figure:
    """Each pipeline stage on its own row: forwards (blue) and backwards (orange), labelled with their micro-batch;
    the gaps are the bubble.

    Args:
        events: one row per action: ``stage``, ``action`` ("F" or "B"), ``microbatch``, ``start_<unit>`` and
            ``end_<unit>`` (``tutorial_lib.runs.pipeline.replay_slots`` for slots, ``pipeline_events`` for ms); with a
            ``panel`` column, one axes per panel value, stacked in order of appearance.
        unit: ``"slot"`` or ``"ms"``: which start/end columns to draw.
        title: the figure's title.

    Raises: ValueError for another unit, or when the start/end columns of ``unit`` are missing.
    """
    if unit not in ("slot", "ms") or not {f"start_{unit}", f"end_{unit}"} <= set(events.columns):
        raise ValueError(f"unit must be 'slot' or 'ms' with start_<unit> and end_<unit> columns, got {unit!r} and "
                         f"columns {list(events.columns)}")
    panels = list(dict.fromkeys(events["panel"])) if "panel" in events else [None]
    stages = sorted(events["stage"].unique())
    fig = Figure(figsize=(10.0, 0.6 + (0.45 * len(stages) + 0.5) * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False, sharex=True)[:, 0]
    for ax, panel in zip(axes, panels):
        df = events if panel is None else events[events["panel"] == panel]
        for row in df.itertuples():
            start, end = getattr(row, f"start_{unit}"), getattr(row, f"end_{unit}")
            ax.broken_barh([(start, end - start)], (row.stage - 0.4, 0.8), facecolors=PIPELINE_COLORS[row.action],
                           edgecolors="white", linewidth=0.5)
            if unit == "slot" or end - start > 0.02 * (df[f"end_{unit}"].max() - df[f"start_{unit}"].min()):
                ax.text((start + end) / 2, row.stage, f"{row.action}{row.microbatch}", ha="center", va="center",
                        fontsize=7, color="white")
        ax.set_yticks(stages, [f"stage {s}" for s in stages])
        ax.set_ylim(max(stages) + 0.6, min(stages) - 0.6)
        if panel is not None:
            ax.set_title(str(panel), fontsize=9, loc="left")
    axes[-1].set_xlabel("time slot (every action one slot)" if unit == "slot" else "ms from the step's first action")
    handles = [axes[0].broken_barh([], (0, 0), facecolors=c, label=label)
               for label, c in (("forward", PIPELINE_COLORS["F"]), ("backward", PIPELINE_COLORS["B"]))]
    fig.legend(handles=handles, fontsize=8, loc="outside upper right", ncols=2)
    text, props = gloss(title or "pipeline schedule per stage")
    fig.suptitle(text, **props)
    return fig
