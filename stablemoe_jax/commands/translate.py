"""``--mode=translate``: one sentence a line in, one translation a line out, in order."""
from __future__ import annotations

import pathlib
import sys

from stablemoe_jax.core.constants import task_name
from stablemoe_jax.core.errors import ConfigError, DataError
from stablemoe_jax.decoding.bleu_report import decode_settings
from stablemoe_jax.decoding.translate_lines import translate_lines
from stablemoe_jax.decoding.translator import make_translate_fn
from stablemoe_jax.experiment import loop


def read_lines(path: str) -> list[str]:
  """The lines of ``path`` (``-``: stdin), without their line ends; DataError naming the line if not UTF-8."""
  raw = sys.stdin.buffer.read() if path == "-" else pathlib.Path(path).read_bytes()
  name = "<stdin>" if path == "-" else path
  if not raw:
    return []
  chunks = raw.split(b"\n")
  if chunks[-1] == b"":  # a final line end ends the last line; it does not start another
    chunks.pop()
  lines = []
  for number, chunk in enumerate(chunks, start=1):
    try:
      lines.append(chunk.decode("utf-8").rstrip("\r"))
    except UnicodeDecodeError as error:
      raise DataError(f"{name}, line {number}: byte 0x{chunk[error.start:error.start + 1].hex()} is not UTF-8; "
                      f"the input must be UTF-8 text, one sentence a line.") from None
  return lines


def write_lines(path: str, lines: list[str]) -> None:
  text = "".join(f"{line}\n" for line in lines)
  if path == "-":
    sys.stdout.write(text)
    sys.stdout.flush()
  else:
    pathlib.Path(path).write_text(text, encoding="utf-8")


def translate_file(config, workdir, step: int | None, src_lang: str, input_path: str, output_path: str) -> dict:
  """Translates ``input_path`` from ``src_lang`` with the checkpoint at ``step`` (None: latest) of ``workdir``."""
  if task_name(config) != "translation":
    raise ConfigError(f"--mode=translate needs a translation config (task='translation'); --config has task="
                      f"{task_name(config)!r}.")
  loop.require_checkpoint(workdir, step)  # before the input is read and anything is built or written
  lines = read_lines(input_path)  # before anything is built: bad input costs nothing
  exp = loop.Experiment(config, workdir)
  try:
    languages = [pair.split("-")[0] for pair in exp.data.pairs]
    if src_lang not in languages:
      raise ConfigError(f"--src_lang={src_lang!r} is unknown; this model translates from {', '.join(languages)}.")
    step, state = exp.restore_for_evaluation(step)
  finally:
    exp.checkpointer.close()
  cfg = exp.config
  settings = decode_settings(cfg)
  translate_fn = make_translate_fn(exp.settings.model, settings["beam_size"], settings["max_len"], settings["length_penalty"],
                                   mesh=exp.mesh)
  out = translate_lines(translate_fn, state.params, exp.data.tokenizer, src_lang, lines, cfg.decode.batch_size,
                        cfg.eval.seq_len, progress=True)
  if out.truncated:
    print(f"warning: {out.truncated} input line(s) longer than eval.seq_len={cfg.eval.seq_len} tokens were "
          f"translated from their truncated start", file=sys.stderr)
  write_lines(output_path, out.lines)
  return {"step": step, "src_lang": src_lang, "sentences": len(lines), "truncated": out.truncated,
          "sentences_per_second": round(out.sentences_per_second, 2), "decode": settings, "output": output_path}
