"""What several commands do: a capture's failure in one line, the Chrome trace printed, a model's config, the quantization flags read, a torchtitan job, quiet warnings."""

from __future__ import annotations

import contextlib
import json


def _capture_failure(exc, verbose: bool) -> str:
    """A CaptureError for the terminal: the first line and the first path's reason; every
    path with ``--verbose``."""
    lines = str(exc).splitlines()
    if verbose or len(lines) < 2:
        return str(exc)
    return f"{lines[0]} {lines[1].strip()} (--verbose: every capture path tried)"


def _print_chrome_trace(report) -> None:
    from ..report.chrome import chrome_trace

    print(json.dumps(chrome_trace(report), sort_keys=True))


def _model_config(target):
    from ..presets import load_target

    model = load_target(target)
    if getattr(model, "config", None) is None:
        raise ValueError(f"{target}: advise and sweep need a Hugging Face model (a preset or "
                         "a config.json); this target has no config")
    return model


def _quantization(args):
    """The quantize= value of the --quantize, --group-size and --activation-scales flags."""
    from ..cost.quant import quantization_of

    if args.quantize is None:
        given = [f for f, v in (("--group-size", args.group_size),
                                ("--activation-scales", args.activation_scales))
                 if v is not None]
        if given:
            raise ValueError(f"{' and '.join(given)} apply to quantized layers: give "
                             "--quantize too")
        return None
    return quantization_of(args.quantize, args.group_size, args.activation_scales)


def _titan_job(args, gpus=None):
    """The torchtitan job of ``--torchtitan`` (None without), refusing a target beside it."""
    if args.torchtitan is None:
        if args.target is None:
            raise ValueError("give a model (a preset, a config.json ...) or --torchtitan "
                             "CONFIG")
        return None
    if args.target is not None:
        raise ValueError(f"--torchtitan sets the model, but a target ({args.target}) was "
                         "given too: give one of them")
    from ..torchtitan import read_torchtitan

    return read_torchtitan(args.torchtitan, gpus=gpus)


@contextlib.contextmanager
def _quiet(verbose: bool):
    """Warnings and log lines from torch and transformers internals stay out of the
    terminal unless ``--verbose``; both are restored afterwards."""
    if verbose:
        yield
        return
    import importlib.util
    import logging
    import warnings

    from ..tracing.export import quiet_loggers

    if importlib.util.find_spec("transformers") is not None:
        # transformers sets its loggers' levels when first imported: import it first
        importlib.import_module("transformers")
    with quiet_loggers("torch", "transformers", level=logging.ERROR), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
