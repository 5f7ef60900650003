"""Fine-tune a config model on a bundled classification task (a derived model for the DAG).

The base model is loaded with a fresh classification head (``AutoModelForSequenceClassification``,
eager attention), trained with AdamW for a fixed number of steps on shuffled batches drawn with
the task's seed, and evaluated on the dev file against the majority-class baseline. The model
and tokenizer are saved with ``save_pretrained`` into a temporary directory that is renamed to
``out_dir`` when complete; ``out_dir/finetune_metrics.json`` records what happened. The
extraction later loads the directory with ``AutoModel``, which drops the classification head.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .corpora import CorpusError, tsv_records
from .data import Record
from .device import job_device
from .extract import length_batches
from .integrity import check_target, replace_dir
from .models import ModelError, ModelSpec, model_kind, resolve
from .progress import progress
from .settings import Settings, from_section, settings_params

log = logging.getLogger("headatlas.core.finetune")

METRICS_FILE = "finetune_metrics.json"


def _texts(records: list[Record]) -> tuple[list[str], list[str] | None]:
    parts = [r.segment_words() for r in records]
    first = [" ".join(p[0]) for p in parts]
    if all(len(p) == 1 for p in parts):
        return first, None
    return first, [" ".join(p[1]) if len(p) > 1 else "" for p in parts]


def encode_records(tokenizer, records: list[Record], max_length: int):
    """The records' texts (one or a pair each) as a padded, truncated batch of the tokenizer."""
    a, b = _texts(records)
    return tokenizer(a, b, padding=True, truncation=True, max_length=max_length, return_tensors="pt")


def label_index(train: list[Record], dev: list[Record], task: dict) -> list[str]:
    """Sorted label strings of the training file; dev labels must be among them."""
    labels = sorted({r.label for r in train})
    if len(labels) < 2:
        raise CorpusError(
            f"{task['train']}: label column {task['label_column']} has {len(labels)} distinct value(s); need at least 2"
        )
    unknown = sorted({r.label for r in dev} - set(labels))
    if unknown:
        raise CorpusError(f"{task['dev']}: labels {unknown[:5]} do not occur in {task['train']}")
    return labels


def evaluate(
    model, tokenizer, records: list[Record], label_ids: np.ndarray, max_length: int, batch_size: int = 64
) -> float:
    import torch

    model.eval()
    device = next(model.parameters(), torch.empty(0)).device
    correct = 0
    # batches of similar lengths pad little (in file order, most of a batch is padding)
    with torch.inference_mode():
        for idx in length_batches([len(r.words) for r in records], batch_size):
            enc = encode_records(tokenizer, [records[k] for k in idx], max_length).to(device)
            pred = model(**enc).logits.argmax(-1).cpu().numpy()
            correct += int((pred == label_ids[idx]).sum())
    return correct / len(records)


def length_bucketed_batches(
    lengths: np.ndarray, batch_size: int, steps: int, rng: np.random.Generator, pool: int = 50
) -> list[np.ndarray]:
    """``steps`` batches of example indices: each epoch is a random permutation cut into pools
    of ``pool`` batches; a pool is sorted by length, cut into batches and the batches are
    shuffled (little padding, still random)."""
    out: list[np.ndarray] = []
    batch_size = min(batch_size, len(lengths))
    while len(out) < steps:
        order = rng.permutation(len(lengths))
        epoch = []
        for start in range(0, len(order), pool * batch_size):
            chunk = order[start : start + pool * batch_size]
            chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
            epoch += [chunk[i : i + batch_size] for i in range(0, len(chunk) - batch_size + 1, batch_size)]
        out += [epoch[i] for i in rng.permutation(len(epoch))]
    return out[:steps]


@dataclass(frozen=True, kw_only=True)
class FinetuneSettings(Settings):
    """The training settings of a ``finetune_tasks`` entry (workflow/schemas/config.schema.yaml); its files and
    columns (``train``, ``dev``, ``text_columns``, ``label_column``) are read from the entry itself."""

    SECTION = "finetune_tasks.NAME"

    steps: int = 300
    lr: float = 5e-5
    batch_size: int = 32
    max_length: int = 64
    dev_limit: int | None = None
    seed: int = 0

    @classmethod
    def of_task(cls, task: dict) -> FinetuneSettings:
        """From a whole task entry (with its ``name``, where the config gave one), errors naming its key path."""
        return from_section(cls, settings_params(cls, task), key=f"finetune_tasks.{task.get('name', 'NAME')}")


def finetune(
    base_spec: ModelSpec, base_dir: str | None, task: dict, out_dir: str, threads: int = 1, device: str | None = None
) -> dict:
    """Fine-tune ``base_spec`` on ``task`` (a ``finetune_tasks`` entry plus its ``name``) into
    ``out_dir`` on ``device`` (default: the job's, :func:`headatlas.core.device.job_device`); return the
    metrics written to ``out_dir/finetune_metrics.json``."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    t0 = time.time()
    check_target(out_dir)  # before the training, not after it
    torch.set_num_threads(threads)
    ft = FinetuneSettings.of_task(task)
    steps, batch_size, max_length, lr, seed = ft.steps, ft.batch_size, ft.max_length, ft.lr, ft.seed
    name = task.get("name", "task")
    train = tsv_records(task["train"], task["text_columns"], task["label_column"])
    dev = tsv_records(task["dev"], task["text_columns"], task["label_column"])[: ft.dev_limit]
    labels = label_index(train, dev, task)
    to_id = {lab: i for i, lab in enumerate(labels)}
    y_train = np.array([to_id[r.label] for r in train])
    y_dev = np.array([to_id[r.label] for r in dev])

    loc, kwargs = resolve(base_spec, base_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(loc, **kwargs)
        config = AutoConfig.from_pretrained(loc, **kwargs)
    except OSError as e:
        raise ModelError(f"model {base_spec.name!r}: cannot load from {loc}: {e}") from e
    kind = model_kind(config, base_spec)
    if tokenizer.pad_token is None:
        pad = tokenizer.eos_token or tokenizer.bos_token
        if pad is None:
            raise ModelError(f"model {base_spec.name!r}: tokenizer has no pad, eos or bos token to pad batches with")
        tokenizer.pad_token = pad
    config.num_labels = len(labels)
    config.id2label = dict(enumerate(labels))
    config.label2id = to_id
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(
        loc, config=config, attn_implementation="eager", dtype=torch.float32, **kwargs
    )
    model.to(device or job_device(base_spec.device))
    model.train()

    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(1, steps - warmup)))
    )
    lengths = np.array([len(r.words) for r in train])
    batches = length_bucketed_batches(lengths, batch_size, steps, rng)
    losses = []
    for step, idx in enumerate(progress(batches, f"fine-tune {base_spec.name} on {name}", steps, "steps")):
        enc = encode_records(tokenizer, [train[i] for i in idx], max_length).to(model.device)
        out = model(**enc, labels=torch.as_tensor(y_train[idx], device=model.device))
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(out.loss.item())
        if (step + 1) % 50 == 0 or step == 0:
            log.info(
                "%s on %s: step %d/%d, loss %.4f", base_spec.name, name, step + 1, steps, float(np.mean(losses[-50:]))
            )

    accuracy = evaluate(model, tokenizer, dev, y_dev, max_length)
    counts = np.bincount(y_train, minlength=len(labels))
    majority = int(np.argmax(counts))
    metrics = {
        "base": base_spec.name,
        "task": name,
        "model_kind": kind,
        "labels": labels,
        "train_size": len(train),
        "dev_size": len(dev),
        "steps": steps,
        "epochs_seen": round(steps * batch_size / len(train), 4),
        "batch_size": batch_size,
        "max_length": max_length,
        "lr": lr,
        "seed": seed,
        "threads": threads,
        "dev_accuracy": round(accuracy, 6),
        "majority_label": labels[majority],
        "majority_baseline": round(float((y_dev == majority).mean()), 6),
        "loss_first_50": round(float(np.mean(losses[:50])), 6),
        "loss_last_50": round(float(np.mean(losses[-50:])), 6),
        "loss_curve": [round(float(np.mean(losses[i : i + 50])), 6) for i in range(0, len(losses), 50)],
        "seconds": round(time.time() - t0, 1),
    }
    out_dir = check_target(out_dir)
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
    replace_dir(tmp, out_dir)
    log.info(
        "%s on %s: dev accuracy %.4f (majority baseline %.4f) after %d steps in %.0f s",
        base_spec.name, name, accuracy, metrics["majority_baseline"], steps, metrics["seconds"],
    )  # fmt: skip
    return metrics


def read_metrics(model_dir: str | Path) -> dict:
    path = Path(model_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; was {model_dir} written by the finetune_model rule?")
    return json.loads(path.read_text())
