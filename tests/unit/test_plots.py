"""Plots take data and return a Figure (Agg backend, no pyplot state)."""

import pandas as pd
import pytest
from matplotlib.figure import Figure

import tutorial_lib as tl


@pytest.fixture
def metrics():
    rows = []
    for rank in (0, 1):
        for step in range(1, 6):
            rows.append({"step": step, "rank": rank, "loss_local": 1 / step + 0.1 * rank, "loss_global": 1 / step + 0.05,
                         "rss_bytes": 300 * 2**20, "param_bytes": 4 * 2**20, "grad_bytes": 4 * 2**20,
                         "optimizer_state_bytes": 8 * 2**20})
    return pd.DataFrame(rows)


@pytest.fixture
def samples():
    return pd.DataFrame([{"time_s": t / 5, "rank": r, "pid": 10 + r, "rss_bytes": (250 + t) * 2**20}
                         for t in range(10) for r in (0, 1)])


def test_loss_plot_has_one_line_per_rank_and_the_global_mean(metrics):
    fig = tl.plots.plot_loss(metrics)
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["rank 0 local (loss_local)", "rank 1 local (loss_local)", "global (loss_global)"]
    assert list(ax.get_lines()[2].get_ydata()) == list(metrics.groupby("step")["loss_global"].first())


def test_memory_plot_uses_samples_in_mib_or_falls_back_to_metrics(metrics, samples):
    ax = tl.plots.plot_memory(samples).axes[0]
    assert len(ax.get_lines()) == 2 and "RSS" in ax.get_ylabel()
    assert ax.get_lines()[0].get_ydata()[0] == 250
    without_tensor_bytes = metrics.drop(columns=[c for c in ("param_bytes", "grad_bytes") if c in metrics])
    ax = tl.plots.plot_memory(None, without_tensor_bytes).axes[0]
    assert ax.get_xlabel() == "step" and ax.get_lines()[0].get_ydata()[0] == 300


def test_on_cpu_the_memory_panel_stacks_what_a_rank_holds_not_rss(metrics, samples):
    """RSS on CPU is mostly `import torch`; the lesson is parameters, gradients, optimizer state (issue 17)."""
    tensors = metrics.assign(param_bytes=2 * 2**20, grad_bytes=2 * 2**20, optimizer_state_bytes=4 * 2**20)
    ax = tl.plots.plot_run(tensors, samples).axes[1]
    assert ax.get_title().startswith("tensor memory per rank") and ax.get_ylabel() == "MiB"
    assert [t.get_text() for t in ax.get_legend().get_texts()][:3] == ["parameters", "gradients", "optimizer state"]
    assert max(line.get_ydata().max() for line in ax.get_lines()) == 8, "the other rank's total: 2 + 2 + 4 MiB"
    on_gpu = tl.plots.plot_run(tensors, samples.assign(gpu_used_bytes=2**30)).axes[1]
    assert "GPU" in on_gpu.get_ylabel(), "on a GPU the sampled device memory stays the panel"


def test_gpu_memory_per_process_is_preferred_when_sampled(samples):
    ax = tl.plots.plot_memory(samples.assign(gpu_used_bytes=2**30)).axes[0]
    assert "GPU" in ax.get_ylabel() and ax.get_lines()[0].get_ydata()[0] == 1024


def test_run_tensor_bytes_compare_and_bandwidth_figures(metrics, samples):
    assert len(tl.plots.plot_run(metrics, samples).axes) == 2
    assert len(tl.plots.plot_run(metrics.iloc[0:0], None).axes) == 2, "an empty run (no step yet) still draws"
    bars = tl.plots.plot_tensor_bytes(metrics).axes[0].patches
    assert [round(b.get_height()) for b in bars] == [4, 4, 4, 4, 8, 8]
    fig = tl.plots.plot_compare({"a": metrics, "b": metrics.assign(loss_global=0.0)})
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["a", "b"]
    bw = pd.DataFrame({"size_bytes": [4096, 1 << 20], "busbw_GBps": [0.01, 1.0]})
    assert tl.plots.plot_bandwidth(bw).axes[0].get_xscale() == "log"


def test_a_run_without_memory_columns_or_samples_still_draws_with_visible_points():
    """Scripts like grad_accum log no memory; a 1-step run must still show its point (regression)."""
    one_step = pd.DataFrame([{"step": 1, "rank": r, "loss_local": 0.4 + r / 10, "loss_global": 0.45} for r in (0, 1)])
    fig = tl.plots.plot_run(one_step)
    loss_ax, mem_ax = fig.axes
    assert all(line.get_marker() == "o" for line in loss_ax.get_lines())
    assert mem_ax.get_title() == "memory per rank (no memory data)"


def test_mesh_plot_puts_each_rank_at_its_coordinate_and_colours_one_shard_alike():
    """Notebook 09's 2 x 2 mesh: who holds which shard, which group runs which collective."""
    ranks = pd.DataFrame({"rank": [0, 1, 2, 3], "mesh_coordinate": [(0, 0), (0, 1), (1, 0), (1, 1)],
                          "holds": ["rows 0-31", "rows 32-63"] * 2})
    ax = tl.plots.plot_mesh(ranks, "all-gather, reduce-scatter", "all-reduce").axes[0]
    boxes = {(round(p.get_y()), round(p.get_x())): p.get_facecolor() for p in ax.patches}
    assert set(boxes) == {(0, 0), (0, 1), (1, 0), (1, 1)}, "one box per rank at (row, column)"
    assert boxes[(0, 0)] == boxes[(1, 0)] != boxes[(0, 1)] == boxes[(1, 1)], "a column (one shard) shares a colour"
    at = {t.get_text(): t.get_position() for t in ax.texts}
    assert at["rank 3\nrows 32-63"] == (1.5, 1.5) and at["rank 1\nrows 32-63"] == (1.5, 0.5)
    assert [t for t in at if t.startswith("shard group")] == ["shard group 0:\nall-gather, reduce-scatter",
                                                              "shard group 1:\nall-gather, reduce-scatter"]
    assert [t for t in at if t.startswith("replicate group")] == ["replicate group 0:\nall-reduce",
                                                                  "replicate group 1:\nall-reduce"]
    assert ax.yaxis_inverted(), "row 0 on top, as the mesh prints"
    with pytest.raises(ValueError, match="two ranks at one mesh coordinate"):
        tl.plots.plot_mesh(ranks.assign(mesh_coordinate=[(0, 0)] * 4))


def test_reshard_tradeoff_plot_draws_held_bytes_and_all_gathers_stacked_by_group_size():
    table = pd.DataFrame({"held_bytes": [200 * 1024, 100 * 1024, 400 * 1024, 200 * 1024],
                          "all_gathers": [{"4": 7}, {"4": 8}, {"4": 4}, {"2": 4, "4": 4}]},
                         index=["default (None)", "True", "False", "2"])
    held, gathers = tl.plots.plot_reshard_tradeoff(table, unsharded_bytes=400 * 1024).axes
    assert [p.get_height() for p in held.patches] == [200, 100, 400, 200], "KiB held between forward and backward"
    assert [t.get_text() for t in held.get_xticklabels()] == ["default (None)", "True", "False", "2"]
    assert list(held.get_lines()[0].get_ydata()) == [400, 400], "the unsharded model, dashed"
    bars = [(p.get_x() + p.get_width() / 2, p.get_y(), p.get_height()) for p in gathers.patches]
    assert bars == [(0, 0, 7), (1, 0, 8), (2, 0, 4), (3, 0, 4),  # groups of 4 first, at the bottom
                    (0, 7, 0), (1, 8, 0), (2, 4, 0), (3, 4, 4)], bars  # the int's backward all-gathers in pairs
    assert [t.get_text() for t in gathers.get_legend().get_texts()] == ["in groups of 4 ranks", "in groups of 2 ranks"]


# --- the Chinese edition's glosses (issue 38 item 5) ---------------------------------------------------------------

import warnings

from tutorial_lib.i18n import has_cjk
from tutorial_lib.launcher.sampler import PID_MISMATCH_NOTE
from tutorial_lib.notebook import figure_text as plots


@pytest.fixture
def chinese():
    tl.set_language("zh")
    plots._warn_no_cjk_font.cache_clear()
    yield
    tl.set_language("en")
    plots._warn_no_cjk_font.cache_clear()


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in [ax.title, *ax.texts]] + [fig._suptitle.get_text() if fig._suptitle else ""]


def test_the_chinese_edition_glosses_sentence_titles_and_memory_notes_and_draws_them_with_a_cjk_font(chinese, samples):
    assert plots.cjk_font() is not None, "a CJK font is installed here (.ci/run: fonts-wqy-microhei)"
    table = pd.DataFrame({"label": ["a", "b"], "x": [1.0, 2.0], "y": [3.0, 1.0]})
    fig = tl.plots.plot_tradeoff(table, "x", "y", title="activation checkpointing: memory vs time")
    assert "activation checkpointing: memory vs time\n激活检查点：内存与时间的取舍" in _texts(fig)
    memory = tl.plots.plot_memory(samples, notes=[PID_MISMATCH_NOTE])
    note = next(t for t in _texts(memory) if "NVML" in t)
    assert note.startswith("no worker process matched") and "NVML 的进程列表里找不到" in note
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns "Glyph ... missing from font(s)" for a character it cannot draw
        fig.canvas.draw()
        memory.canvas.draw()
    untranslated = tl.plots.plot_tradeoff(table, "x", "y", title="my own title")
    assert "my own title" in _texts(untranslated), "a title the catalogue does not know stays as given"


def test_the_english_edition_and_a_machine_without_a_cjk_font_keep_english_and_say_which_font_to_install(
        chinese, monkeypatch):
    table = pd.DataFrame({"label": ["a"], "x": [1.0], "y": [2.0]})
    monkeypatch.setattr(plots, "cjk_font", lambda: None)
    with pytest.warns(UserWarning, match="apt-get install fonts-wqy-microhei") as warned:
        fig = tl.plots.plot_tradeoff(table, "x", "y", title="activation checkpointing: memory vs time")
    assert "activation checkpointing: memory vs time" in _texts(fig)
    said = str(warned[0].message)  # issue 45 item 17: the Chinese edition's reader is told in Chinese
    assert has_cjk(said) and "Jupyter 内核" in said and "CJK" in said, said
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per kernel, not on every figure
        tl.plots.plot_tradeoff(table, "x", "y", title="activation checkpointing: memory vs time")
    with pytest.warns(UserWarning, match="^no CJK font is installed"):  # once per language, in that language
        plots._warn_no_cjk_font("en")
    tl.set_language("en")
    monkeypatch.undo()
    english = tl.plots.plot_tradeoff(table, "x", "y", title="activation checkpointing: memory vs time")
    assert "activation checkpointing: memory vs time" in _texts(english)


# --- readable figures (issue 45 item 3): legends off the data, whole steps, local and global named ---------------


def _four_steps():
    rows = [{"step": step, "rank": rank, "loss_local": 1 / step + 0.1 * rank, "loss_global": 1 / step + 0.05,
             "param_bytes": 4 * 2**20, "grad_bytes": 4 * 2**20, "optimizer_state_bytes": 8 * 2**20,
             "rss_bytes": 300 * 2**20, "loss_scale": 2.0**(16 - step), "step_skipped": step == 2,
             "attempt": 0, "resumed_from_step": 0}
            for rank in (0, 1) for step in range(1, 5)]
    return pd.DataFrame(rows)


def _figures_with_legends(metrics):
    table = pd.DataFrame({"label": ["DDP rank 0", "FSDP rank 0"], "predicted_bytes": [2**24, 2**23],
                          "measured_bytes": [2**24, 2**23]})
    return {"plot_run": tl.plots.plot_run(metrics), "plot_loss": tl.plots.plot_loss(metrics),
            "plot_memory": tl.plots.plot_memory(None, metrics.drop(columns=["param_bytes", "grad_bytes"])),
            "plot_tensor_bytes": tl.plots.plot_tensor_bytes(metrics),
            "plot_compare": tl.plots.plot_compare({"a": metrics, "b": metrics.assign(loss_global=0.0)}),
            "plot_loss_scale": tl.plots.plot_loss_scale(metrics), "plot_memory_prediction": tl.plots.plot_memory_prediction(table),
            "plot_resume": tl.plots.plot_resume(metrics, reference=metrics)}


def test_no_legend_covers_the_data_and_none_leaves_the_figure():
    for name, fig in _figures_with_legends(_four_steps()).items():
        fig.draw_without_rendering()  # lays the figure out (constrained layout) as a display would
        legends = [(ax, ax.get_legend()) for ax in fig.axes if ax.get_legend() is not None]
        assert legends, name
        for ax, legend in legends:
            box, data = legend.get_window_extent(), ax.get_window_extent()  # the axes hold all the data drawn
            assert not box.overlaps(data), (name, box, data)
            assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 <= box.y1 <= fig.bbox.y1, \
                (name, "the legend is cut off")


def _shown_ticks(ax):
    low, high = sorted(ax.get_xlim())
    return [t for t in ax.get_xticks() if low <= t <= high]


def test_a_four_step_run_has_whole_step_ticks_on_every_step_axis():
    """A 4-step run's memory panel ticked 1.0, 1.5, 2.0, ... (its stacked tensor bytes had no integer locator)."""
    metrics = _four_steps()
    figures = _figures_with_legends(metrics)
    axes = [*figures["plot_run"].axes, figures["plot_loss"].axes[0], figures["plot_memory"].axes[0],
            figures["plot_compare"].axes[0], figures["plot_loss_scale"].axes[0], figures["plot_resume"].axes[0]]
    for ax in axes:
        assert ax.get_xlabel() == "step"
        ticks = _shown_ticks(ax)
        assert ticks == [1, 2, 3, 4] and all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)
    one = tl.plots.plot_run(metrics[metrics["step"] == 3])
    assert [list(ax.get_xticks()) for ax in one.axes] == [[3], [3]], "one step: that step, the only tick"


def test_the_loss_legend_says_which_line_is_a_ranks_own_loss_and_which_the_mean_over_ranks():
    legend = tl.plots.plot_run(_four_steps()).axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        "rank 0 local (loss_local)", "rank 1 local (loss_local)", "global (loss_global)"]
    assert legend.get_title().get_text() == ("local: a rank's loss on its own samples\n"
                                             "global: the mean of all ranks' losses")
    only_local = tl.plots.plot_loss(_four_steps().drop(columns=["loss_global"])).axes[0].get_legend()
    assert only_local.get_title().get_text() == "", "no global line: nothing to tell apart"


def test_the_chinese_edition_glosses_the_loss_legends_key_with_a_cjk_font(chinese):
    fig = tl.plots.plot_run(_four_steps())
    title = fig.axes[0].get_legend().get_title()
    assert title.get_text() == ("local: a rank's loss on its own samples\nglobal: the mean of all ranks' losses\n"
                                "local：每个 rank 在自己样本上的损失\nglobal：所有 rank 损失的平均值")
    assert plots.cjk_font() in title.get_fontfamily()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a glyph the font cannot draw warns
        fig.canvas.draw()
