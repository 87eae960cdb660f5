"""`ragspec calibrate`: measure (or show) this machine's forward-cost curve for a model."""

from __future__ import annotations

import json

import click

from ragspec import paths
from ragspec.commands.common import json_option, model_options


@click.command("calibrate")
@click.option("--show", is_flag=True,
              help="Print the cached curve and where it came from; measure nothing.")
@click.option("--if-missing", is_flag=True,
              help="Get this machine ready for the model (what `make demo` runs before the "
                   "chat): build the CPU kernels and convert the model if not done yet, then "
                   "measure only if no curve is cached, within 20 s. A machine too busy to "
                   "measure is not an error: answers use a conservative curve until it is "
                   "measured.")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png",
              type=click.Path(dir_okay=False), help="Also draw the curve into a PNG.")
@click.option("--max-draft", default=16, show_default=True, type=click.IntRange(1, 64),
              help="Measure forwards over 1 to max-draft + 1 tokens.")
@click.option("--max-seconds", default=120.0, show_default=True,
              type=click.FloatRange(1, min_open=False),
              help="Stop measuring after this long (all attempts together); a curve cut short "
                   "of enough rounds is shown but not cached.")
@model_options
@json_option
def calibrate(show, if_missing, plot_path, max_draft, max_seconds, model_spec, device, exact,
              weights, as_json):
    """Measure what a forward over n new tokens costs here, for the draft policy.

    A verify step over a draft of k tokens is a forward over k + 1 tokens; on a CPU it costs
    more than a one-token step, and how much more decides how long a draft pays. The curve is
    measured once per model, device, weights and thread count, after a short and a long context
    (interleaved rounds, a low quantile of each size) and cached next to the converted models;
    a measurement disturbed by other work on the machine, or cut short by --max-seconds, is not
    cached. Run this on an idle machine to refresh it.
    """
    from ragspec.decoding import calibrate as cal
    from ragspec.models.load import ModelNotFound, load_model

    cache = paths.models_dir()
    if if_missing:
        if show or plot_path:
            raise click.UsageError("--if-missing measures at most once: it takes neither "
                                   "--show nor --plot")
        _get_ready(model_spec, device, exact, weights, max_draft, as_json)
        return
    try:
        loaded = load_model(model_spec, cache, device=device, exact=exact, weights=weights)
    except ModelNotFound as exc:
        raise click.ClickException(str(exc)) from exc
    key = cal.cost_key(loaded.model, loaded.device, loaded.dtype)
    if show:
        calibration = cal.cached(loaded.model, loaded.device, loaded.dtype, cache)
        if calibration is None:
            raise click.ClickException(
                f"no curve cached for {key} in {cache / cal.COSTS_FILE}; run `ragspec calibrate`")
        saved = True
    else:
        if not as_json:
            click.echo(f"Measuring {max_draft + 1} sizes x {cal.ROUNDS} rounds (at most "
                       f"{max_seconds:g} s)...", err=True)
        calibration = cal.measure_and_save(loaded.model, loaded.device, loaded.dtype,
                                           max_draft + 1, cache, seconds=max_seconds)
        if calibration is None:
            raise click.ClickException(
                f"not one round of the measurement finished in {max_seconds:g} s: the machine "
                f"is busy or the model large; try again when it is idle, or with a larger "
                f"--max-seconds")
        saved = calibration.trusted
    if plot_path:
        _plot(calibration, key, plot_path)
    if as_json:
        click.echo(json.dumps({"key": key, "file": str(cache / cal.COSTS_FILE), "saved": saved,
                               **calibration.to_dict()}))
        return
    _print(calibration, key, cache / cal.COSTS_FILE, saved)


def _get_ready(model_spec, device, exact, weights, max_draft: int, as_json: bool) -> None:
    """Load the model as every command does (kernels built and the model converted once, each
    with a line), measuring the curve within the product's bound only when none is cached."""
    from ragspec.commands.common import generator_from_options
    from ragspec.decoding import calibrate as cal
    from ragspec.loading import describe_device

    loaded, gen = generator_from_options(model_spec, device, exact, max_draft, quiet=as_json,
                                         weights=weights)
    measured = not getattr(gen, "provisional", False)
    if as_json:
        click.echo(json.dumps({"model": loaded.name, "device": describe_device(loaded),
                               "key": cal.cost_key(loaded.model, loaded.device, loaded.dtype),
                               "curve_cached": measured}))
        return
    curve = ("its forward-cost curve is measured" if measured else
             "its forward-cost curve is not measured yet (answers draft little until it is)")
    click.echo(f"Ready: {loaded.name} on {describe_device(loaded)}; {curve}.")


def _print(calibration, key: str, path, saved: bool) -> None:
    from ragspec.decoding.calibrate import MAX_SPREAD, MIN_ROUNDS

    far = calibration.far_seconds
    contexts = (f"{calibration.context} and {calibration.far_context}" if far
                else f"{calibration.context}")
    click.echo(f"{key}\nmeasured {calibration.measured_at}, {calibration.rounds} rounds after "
               f"{contexts} cached tokens, spread {calibration.spread:.0%}")
    if saved:
        click.echo(f"cached in {path}")
    elif calibration.rounds < MIN_ROUNDS:
        click.echo(f"not cached: only {calibration.rounds} rounds finished in time (a trusted "
                   f"curve needs {MIN_ROUNDS}); measure again when the machine is idle, or with "
                   f"a larger --max-seconds")
    else:
        click.echo(f"not cached: the spread is over {MAX_SPREAD:.0%}, so the machine was busy; "
                   f"measure again when it is idle")
    base = calibration.seconds[0]
    head = f"{'tokens':>6}  {'ms':>7}  {'x c(1)':>6}"
    if far:
        head += f"   at {calibration.far_context}: {'ms':>7}  {'x c(1)':>6}"
    click.echo(head)
    for n, seconds in enumerate(calibration.seconds, 1):
        line = f"{n:>6}  {1000 * seconds:>7.1f}  {seconds / base:>6.2f}"
        if far:
            line += f"   {' ' * (len(str(calibration.far_context)) + 4)}{1000 * far[n - 1]:>7.1f}  {far[n - 1] / far[0]:>6.2f}"
        click.echo(line)


def _plot(calibration, key: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = range(1, len(calibration.seconds) + 1)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(sizes, [1000 * s for s in calibration.seconds], marker="o",
            label=f"after {calibration.context} tokens")
    if calibration.far_seconds:
        ax.plot(sizes, [1000 * s for s in calibration.far_seconds], marker="s",
                label=f"after {calibration.far_context} tokens")
        ax.legend(fontsize=8)
    ax.set_xlabel("tokens in the forward (draft length + 1)")
    ax.set_ylabel("ms per forward")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{key}\n{calibration.measured_at}, spread {calibration.spread:.0%}", fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        plt.close(fig)


COMMANDS = [calibrate]
