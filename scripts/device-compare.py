"""The parts of scripts/device-check that read what baton wrote.

usage:
  device-compare.py logits MODEL_DIR LOGITS_JSON DEVICE
      PyTorch (transformers, SDPA attention, bf16 on a GPU, f32 on the CPU) runs the ids
      baton ran and the cosine of the two last-position logits is printed as JSON.
      Exits 0 with {"skipped": why} where torch or transformers cannot be imported.
  device-compare.py paths BATCHED_JSON FUSED_JSON
      The cosine of the last-position logits baton wrote on its two attention paths for
      the same ids, and whether their top tokens agree.
  device-compare.py prefill MODEL_DIR DEVICE LENGTHS
      PyTorch's prefill (transformers, SDPA attention, bf16 on a GPU) of LENGTHS tokens
      (comma-separated) on MODEL_DIR: median ms of three after a warm-up, the cache
      built and the last position's logits, as baton's re-prefill does. Exits 0 with
      {"skipped": why} where torch or transformers cannot be imported.
  device-compare.py summary WORK_DIR DEVICE ACTIVATIONS
      One JSON document of every step: exit code, seconds, and what it measured.
"""

import json
import math
import re
import sys
from pathlib import Path


def torch_model(model_dir, device):
    """(torch, the model on the device with SDPA attention, its dtype), or None after
    printing why there is no comparison where torch or transformers cannot be imported."""
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except Exception as e:  # noqa: BLE001 - any import failure means no comparison
        print(json.dumps({"skipped": f"no torch/transformers here ({type(e).__name__})"}))
        return None
    on_gpu = device.startswith("cuda") and torch.cuda.is_available()
    dtype = torch.bfloat16 if on_gpu else torch.float32
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, torch_dtype=dtype, attn_implementation="sdpa"
    ).to("cuda" if on_gpu else "cpu")
    return torch, model, dtype


def logits(model_dir, logits_json, device):
    doc = json.loads(Path(logits_json).read_text())
    got = torch_model(model_dir, device)
    if got is None:
        return
    torch, model, dtype = got
    ids = torch.tensor([doc["ids"]], device=model.device)
    with torch.no_grad():
        theirs = model(ids).logits[0, -1].float().cpu()
    ours = torch.tensor(doc["logits"], dtype=torch.float32)
    cos = torch.nn.functional.cosine_similarity(ours, theirs, dim=0).item()
    print(
        json.dumps(
            {
                "tokens": len(doc["ids"]),
                "cosine": cos,
                "same_top1": int(ours.argmax()) == int(theirs.argmax()),
                "torch": torch.__version__,
                "pytorch_dtype": str(dtype),
            }
        )
    )


def paths(batched_json, fused_json):
    a = json.loads(Path(batched_json).read_text())
    b = json.loads(Path(fused_json).read_text())
    if a["ids"] != b["ids"]:
        sys.exit("the two runs read different ids")
    x, y = a["logits"], b["logits"]
    dot = sum(p * q for p, q in zip(x, y))
    norm = math.sqrt(sum(p * p for p in x)) * math.sqrt(sum(q * q for q in y))
    top = lambda v: max(range(len(v)), key=v.__getitem__)  # noqa: E731
    print(json.dumps({"tokens": len(a["ids"]), "cosine": dot / norm if norm else None,
                      "same_top1": top(x) == top(y)}))


def prefill(model_dir, device, lengths):
    import time

    got = torch_model(model_dir, device)
    if got is None:
        return
    torch, model, dtype = got
    on_gpu = model.device.type == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    rows = []
    with torch.no_grad():
        for n in (int(x) for x in lengths.split(",")):
            ids = torch.randint(0, vocab, (1, n), generator=gen).to(model.device)

            def once():
                sync()
                t0 = time.perf_counter()
                # The base model, then the head on the last position only: a prefill's
                # output, without 32K rows of vocabulary logits no prefill keeps.
                h = model.model(input_ids=ids, use_cache=True).last_hidden_state
                model.lm_head(h[:, -1:])
                sync()
                return (time.perf_counter() - t0) * 1000

            once()
            times = sorted(once() for _ in range(3))
            rows.append({"tokens": n, "median_ms": times[1], "min_ms": times[0], "max_ms": times[2]})
            # Printed as it goes: a step that runs out of time keeps the lengths it timed.
            print(json.dumps({"partial": rows}), file=sys.stderr, flush=True)
    print(json.dumps({"torch": torch.__version__, "pytorch_dtype": str(dtype),
                      "attention": "sdpa", "results": rows}))


def switch_measures(session):
    """The first switch's per-layer measures in a session file."""
    if not session.is_file():
        return None
    for line in session.read_text().splitlines():
        e = json.loads(line).get("event", {})
        if e.get("type") == "switch_measured":
            m = e.get("metrics")
            if m:
                return {k: m[k] for k in ("attention_cosine", "r2_k", "r2_v")}
    return None


def step(work, name):
    rc_file = work / "steps" / f"{name}.rc"
    if not rc_file.is_file():
        return {"ran": False}
    rc, seconds = rc_file.read_text().split()
    out = (work / "steps" / f"{name}.out").read_text()
    err = (work / "steps" / f"{name}.err").read_text()
    s = {"exit": int(rc), "seconds": round(float(seconds), 2)}
    if int(rc) in (124, 137):
        s["timed_out"] = True
    if int(rc) != 0:
        s["error"] = err.strip().splitlines()[-1:] if err.strip() else []
    return s, out, err


STEPS = ("version", "libraries", "models", "generate", "logits", "generate-fused", "paths",
         "calibrate", "bench", "bench-long", "bench-fused", "prefill-torch", "eval", "switch",
         "switch-cpu")


def prefill_table(steps):
    """The re-prefill of the target on each attention path beside PyTorch's, and the map,
    per length: what docs/gpu.md's table holds."""
    def points(name):
        try:
            return {p["tokens"]: p for p in steps[name]["result"]["results"][0]["points"]}
        except (KeyError, IndexError, TypeError):
            return {}

    batched = {**points("bench"), **points("bench-long")}
    fused = points("bench-fused")
    try:
        torch = {r["tokens"]: r["median_ms"] for r in steps["prefill-torch"]["result"]["results"]}
    except (KeyError, TypeError):
        torch = {}
    rows = []
    for n in sorted(set(batched) | set(fused) | set(torch)):
        row = {"tokens": n}
        for path, got in (("batched", batched), ("fused", fused)):
            if n in got:
                row[f"reprefill_{path}_ms"] = got[n]["reprefill_full"]["median_ms"]
                row[f"map_{path}_ms"] = got[n]["map_full"]["median_ms"]
        if n in torch:
            row["prefill_torch_ms"] = torch[n]
            for path in ("batched", "fused"):
                ms = row.get(f"reprefill_{path}_ms")
                if ms is not None and torch[n] > 0:
                    row[f"{path}_over_torch"] = ms / torch[n]
        rows.append(row)
    return rows


def summary(work, device, activations):
    work = Path(work)
    doc = {"format": "baton.device-check", "device": device, "activations": activations, "steps": {}}
    for name in STEPS:
        skip = work / "steps" / f"{name}.skip"
        if skip.is_file():
            doc["steps"][name] = {"skipped": skip.read_text().strip()}
            continue
        got = step(work, name)
        if got == {"ran": False}:
            doc["steps"][name] = got
            continue
        s, out, err = got
        if s["exit"] == 0:
            if name == "version":
                doc["build"] = out.strip()
                doc["fused_attention"] = "fused attention" in out
            elif name in ("generate", "generate-fused"):
                m = re.search(r"prefill (\d+) tokens at ([\d.]+) tokens/s; decode (\d+) tokens at ([\d.]+)", err)
                if m:
                    s["prefill_tokens"], s["prefill_tok_s"] = int(m[1]), float(m[2])
                    s["decode_tokens"], s["decode_tok_s"] = int(m[3]), float(m[4])
            elif name in ("logits", "paths", "prefill-torch", "eval") or name.startswith("bench"):
                s["result"] = json.loads(out)
        elif name == "prefill-torch":
            # Out of time or failed part way: the lengths it timed, as it printed them.
            partial = [l for l in err.splitlines() if l.startswith('{"partial"')]
            if partial:
                s["result"] = {"results": json.loads(partial[-1])["partial"], "partial": True}
        doc["steps"][name] = s
    doc["prefill"] = prefill_table(doc["steps"])
    dev, cpu = switch_measures(work / "device.jsonl"), switch_measures(work / "cpu.jsonl")
    if dev and cpu:
        diff = {
            k: max(abs(a - b) for a, b in zip(dev[k], cpu[k]))
            for k in dev
            if all(isinstance(x, (int, float)) and math.isfinite(x) for x in dev[k] + cpu[k])
        }
        doc["map_device_vs_cpu"] = {"max_abs_difference": diff, "device": dev, "cpu": cpu}
    else:
        doc["map_device_vs_cpu"] = {"skipped": "a switch run did not record its measures"}
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "logits":
        logits(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "paths":
        paths(*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "prefill":
        prefill(*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "summary":
        summary(*sys.argv[2:])
    else:
        sys.exit(__doc__)
