"""Ours beside the xLSTM peers: reads the outputs that bench/xlstm_peers.sh writes and prints the
ratios ours / theirs wherever both ran. Plain text parsing (no torch):

    python3 bench/xlstm_ratios.py KERNELS_FILE MODELS_FILE

KERNELS_FILE holds `mesanet bench xlstm --backend cuda` and bench/xlstm_kernels_bench.py's output,
MODELS_FILE `mesanet bench train` / `bench decode` and bench/hf_xlstm_bench.py's or
bench/nxai_xlstm_model_bench.py's (one file may be both). Time ratios
(ms) below 1 and throughput ratios (tokens/s) above 1 are ours being faster.
"""
import re
import sys

NUM = r"([0-9.]+)"


def kernel_rows(text):
    """{(core, shape, impl): (fwd ms, f+b ms, f+b strm)} of both tools' tables (impl 'ours' for mesanet's)."""
    rows, core, ours = {}, None, False
    for line in text.splitlines():
        if line.startswith("mLSTM core") or line.startswith("sLSTM core"):
            core, ours = line[:5], True
        elif line.startswith("mLSTM kernels") or line.startswith("sLSTM kernels"):
            core, ours = line[:5], False
        elif line.startswith("triton.testing.do_bench"):
            core = None
        if core is None:
            continue
        extra = r"\s+" + NUM if core == "mLSTM" else ""  # the mLSTM tables' TFLOP/s column
        head = r"^(\d+(?:x\d+){3,4})\s+" + ("" if ours else r"(\S+)\s+")
        m = re.match(head + r"\|\s+" + NUM + r"\s+(\d+)" + extra + r"\s+\|\s+" + NUM + r"\s+" + NUM + r"\s", line)
        if not m:
            continue
        g = m.groups()
        shape, impl = g[0], "ours" if ours else g[1]
        nums = g[1:] if ours else g[2:]
        fwd, fb, strm = float(nums[0]), float(nums[-2]), float(nums[-1])
        rows[(core, shape, impl)] = (fwd, fb, strm)
    return rows


PEER_MODELS = {"hf-7b-160m": "xlstm-7b-160m", "nxai-7b-160m": "xlstm-7b-160m", "nxai-125m": "xlstm-125m",
               "nxai-125m-tfla": "xlstm-125m", "nxai10-125m-tfla": "xlstm10-125m", "nxai-125m-parallel": "xlstm-125m"}


def model_rows(text):
    """Training {(config, impl): (tokens/s, device GB)} and decoding {(config, impl, B): tokens/s}."""
    train, decode = {}, {}
    lines = text.splitlines()
    cur = None
    for i, line in enumerate(lines):
        m = re.match(r"^training (\S+) \(\d+ parameters\) on cuda", line)
        if m and i + 1 < len(lines):
            t = re.match(r"^\s+" + NUM + r" tokens/s, " + NUM + r" ms/step, device memory in use " + NUM + " GB",
                         lines[i + 1])
            if t:
                train[(m.group(1), "ours")] = (float(t.group(1)), float(t.group(3)))
        m = re.match(r"^(\S+) train (\S+), batch \d+ x \d+: " + NUM + r" tokens/s, .* device memory in use " + NUM, line)
        if m and m.group(1) in PEER_MODELS:
            train[(PEER_MODELS[m.group(1)], f"{m.group(1)} {m.group(2)}")] = (float(m.group(3)), float(m.group(4)))
        m = re.match(r"^decoding (\S+) \(\d+ parameters\) on cuda", line)
        if m:
            cur = m.group(1)
            continue
        m = re.match(r"^\s*(\d+) \|\s+" + NUM + r"\s+" + NUM + r" \|\s+(\S+)\s+(\S+) \|", line)
        if m and cur:
            B = int(m.group(1))
            decode[(cur, "ours eager", B)] = float(m.group(3))
            if m.group(5) != "-":
                decode[(cur, "ours graph", B)] = float(m.group(5))
        m = re.match(r"^(\S+) decode B=\s*(\d+): (.*)$", line)
        if m and m.group(1) in PEER_MODELS:
            cfg, B = PEER_MODELS[m.group(1)], int(m.group(2))
            g = re.search(r"generate [0-9.]+ ms/token, " + NUM + " tokens/s", m.group(3))
            if g:
                decode[(cfg, f"{m.group(1)} generate", B)] = float(g.group(1))
            s = re.search(r"steps [0-9.]+ ms/step, " + NUM + " tokens/s", m.group(3))
            if s:
                decode[(cfg, f"{m.group(1)} steps", B)] = float(s.group(1))
    return train, decode


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: python3 bench/xlstm_ratios.py KERNELS_FILE MODELS_FILE")
    texts = []
    for path in sys.argv[1:]:
        try:
            with open(path) as f:
                texts.append(f.read())
        except OSError as e:
            print(f"({path}: {e.strerror}; no ratios from it)")
            texts.append("")
    k = kernel_rows(texts[0])
    print("cores: ours / theirs, time ratios (< 1: ours faster)")
    print(f"{'core':5s} {'shape':20s} {'theirs':22s} | {'fwd':>7s} {'f+b':>7s} {'f+b strm':>8s}")
    n = 0
    for (core, shape, impl), (f, b, s) in sorted(k.items()):
        if impl == "ours" or (core, shape, "ours") not in k:
            continue
        of, ob, os_ = k[(core, shape, "ours")]
        print(f"{core:5s} {shape:20s} {impl:22s} | {of / f:7.2f} {ob / b:7.2f} {os_ / s:8.2f}")
        n += 1
    if not n:
        print("  (no shape with both)")
    train, decode = model_rows(texts[1])
    print("\ntraining: ours / theirs, tokens/s (> 1: ours faster) and device memory in use (< 1: ours smaller)")
    n = 0
    for (cfg, impl), (tps, mem) in sorted(train.items()):
        if impl == "ours" or (cfg, "ours") not in train:
            continue
        otps, omem = train[(cfg, "ours")]
        print(f"  {cfg:14s} vs {impl:22s}: tokens/s {otps / tps:6.2f}x, memory {omem / mem:5.2f}x")
        n += 1
    if not n:
        print("  (no config with both)")
    print("\ndecoding: ours / theirs, tokens/s (> 1: ours faster)")
    n = 0
    for (cfg, impl, B), tps in sorted(decode.items()):
        if impl.startswith("ours"):
            continue
        for mine in ("ours eager", "ours graph"):
            if (cfg, mine, B) in decode:
                print(f"  {cfg:14s} B={B:4d} {mine:10s} vs {impl:24s}: {decode[(cfg, mine, B)] / tps:6.2f}x")
                n += 1
    if not n:
        print("  (no config with both)")


if __name__ == "__main__":
    main()
