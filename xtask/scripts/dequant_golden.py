#!/usr/bin/env python3
"""Dequantization golden fixtures for nx-lazy-weight, produced by an independent oracle.

The oracle is the Python `gguf` package (0.19.0), `gguf.quants.dequantize`, which
is a separate implementation from ggml's C code and from ours. For every tensor
type found in the model, the first tensor of that type (in file order) gives its
first and last rows; for every supported type, synthetic rows made of random raw
block bytes (fixed seed, f16 scale fields forced to finite values) exercise bit
patterns a trained model may never contain. Values are written as f32 bit
patterns (hex u32) so the Rust side can compare bit for bit.

Also writes `q8_0_quantize.json`: random f32 rows quantized by
`gguf.quants.quantize(.., Q8_0)`, which mirrors ggml's `quantize_row_q8_0_ref`
(the activation quantizer our Q4_0/Q5_0/Q8_0 dot products see).

Also writes `q4_1_quantize.json`, `q5_1_quantize.json`, `mxfp4_quantize.json`,
`tq2_0_quantize.json` and `tq1_0_quantize.json`: random rows quantized by
`gguf.quants.quantize`, which mirrors ggml's `quantize_row_*_ref` (what
`llama-quantize` does for those types without an importance matrix); nx's weight
quantizers must produce the same bytes.

Usage: dequant_golden.py MODEL_PATH OUT_DIR
"""

import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

SEED = 20240611
GGUF_VERSION_EXPECTED = "0.19.0"

# (block elements, block bytes, byte offsets of f16 scale fields inside a block)
LAYOUTS = {
    "F32": (1, 4, []),
    "F16": (1, 2, []),
    "BF16": (1, 2, []),
    "Q4_0": (32, 18, [0]),
    "Q5_0": (32, 22, [0]),
    "Q8_0": (32, 34, [0]),
    "Q4_K": (256, 144, [0, 2]),
    "Q5_K": (256, 176, [0, 2]),
    "Q6_K": (256, 210, [208]),
    "Q4_1": (32, 20, [0, 2]),
    "Q5_1": (32, 24, [0, 2]),
    "Q2_K": (256, 84, [80, 82]),
    "Q3_K": (256, 110, [108]),
    "IQ4_NL": (32, 18, [0]),
    "IQ4_XS": (256, 136, [0]),
    "MXFP4": (32, 17, []),
    "TQ2_0": (256, 66, [64]),
    "TQ1_0": (256, 54, [52]),
    "IQ2_XXS": (256, 66, [0]),
    "IQ2_XS": (256, 74, [0]),
    "IQ2_S": (256, 82, [0]),
    "IQ3_XXS": (256, 98, [0]),
    "IQ3_S": (256, 110, [0]),
    "IQ1_S": (256, 50, [0]),
    "IQ1_M": (256, 56, []),  # its f16 scale is spread over four nibbles: see synthetic_raw
}
# Types added after the first fixtures draw their random blocks from streams of their
# own, so the files of the older types keep their bytes.
LATER_TYPES = ("Q4_1", "Q5_1", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "MXFP4", "TQ2_0", "TQ1_0",
               "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")
SYNTHETIC_BLOCKS_PER_ROW = {
    "F32": 96, "F16": 160, "BF16": 160,
    "Q4_0": 8, "Q5_0": 8, "Q8_0": 8,
    "Q4_K": 2, "Q5_K": 2, "Q6_K": 2,
    "Q4_1": 8, "Q5_1": 8, "IQ4_NL": 8,
    "Q2_K": 2, "Q3_K": 2, "IQ4_XS": 2,
    "MXFP4": 8, "TQ2_0": 2, "TQ1_0": 2,
    "IQ2_XXS": 2, "IQ2_XS": 2, "IQ2_S": 2, "IQ3_XXS": 2, "IQ3_S": 2, "IQ1_S": 2, "IQ1_M": 2,
}
SYNTHETIC_ROWS = 3


def f32_bits_hex(values: np.ndarray) -> list:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ["%08x" % int(b) for b in bits]


def dequant_row(type_name: str, raw: np.ndarray) -> np.ndarray:
    qtype = T[type_name]
    out = dequantize(raw.astype(np.uint8, copy=False), qtype)
    if type_name == "BF16":
        # gguf's BF16 path reinterprets the u8 buffer itself; make sure it saw u16 pairs.
        assert out.size == raw.size // 2
    return np.asarray(out, dtype=np.float32).reshape(-1)


def row_record(origin: str, row: int, type_name: str, raw: np.ndarray) -> dict:
    values = dequant_row(type_name, raw)
    return {
        "origin": origin,
        "row": row,
        "row_len": int(values.size),
        "raw_hex": raw.astype(np.uint8).tobytes().hex(),
        "values_f32_bits": f32_bits_hex(values),
    }


def random_finite_f16(rng: np.random.Generator, n: int, lo_exp: int, hi_exp: int) -> np.ndarray:
    """Random signed f16 values with magnitude 2^[lo_exp, hi_exp): finite, mostly normal."""
    mag = np.exp2(rng.uniform(lo_exp, hi_exp, size=n)).astype(np.float16)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0).astype(np.float16)
    return (mag * sign).astype(np.float16)


def synthetic_raw(rng: np.random.Generator, type_name: str, n_blocks: int) -> np.ndarray:
    block_elems, block_bytes, scale_offsets = LAYOUTS[type_name]
    if type_name == "F32":
        vals = rng.standard_normal(n_blocks).astype(np.float32) * np.float32(3.0)
        vals[:4] = np.array([0.0, -0.0, 1e-40, -3.0e38], dtype=np.float32)  # zero, -0, subnormal, huge
        return vals.view(np.uint8)
    if type_name == "F16":
        bits = rng.integers(0, 1 << 16, size=n_blocks, dtype=np.uint32).astype(np.uint16)
        # no inf/NaN: exponent field 0x1f replaced by 0x1e; subnormals and -0 stay
        exp = (bits >> 10) & 0x1F
        bits = np.where(exp == 0x1F, bits & ~np.uint16(1 << 10), bits).astype(np.uint16)
        return bits.view(np.uint8)
    if type_name == "BF16":
        bits = rng.integers(0, 1 << 16, size=n_blocks, dtype=np.uint32).astype(np.uint16)
        exp = (bits >> 7) & 0xFF
        bits = np.where(exp == 0xFF, bits & ~np.uint16(1 << 7), bits).astype(np.uint16)
        return bits.view(np.uint8)
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint16).astype(np.uint8)
    for off in scale_offsets:
        scales = random_finite_f16(rng, n_blocks, -14, 2)
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    if type_name == "MXFP4":
        # The E8M0 scale byte: any value but those whose largest level (12·2^(e-128))
        # overflows f32 (e > 250); the first two blocks take the subnormal scales e = 0, 1.
        raw[:, 0] = rng.integers(0, 251, size=n_blocks, dtype=np.uint16).astype(np.uint8)
        raw[:2, 0] = [0, 1]
    if type_name == "IQ1_M":
        # The f16 scale: its four nibbles are the top nibbles of the u16 words at 48..56.
        bits = random_finite_f16(rng, n_blocks, -14, 2).view(np.uint16)
        for k in range(4):
            nibble = ((bits >> (4 * k)) & 0xF).astype(np.uint8)
            raw[:, 49 + 2 * k] = (raw[:, 49 + 2 * k] & 0x0F) | (nibble << 4)
    return raw.reshape(-1)


def model_rows(model_path: str) -> dict:
    reader = gguf.GGUFReader(model_path)
    chosen = {}
    for tensor in reader.tensors:
        name = tensor.tensor_type.name
        if name in LAYOUTS and name not in chosen:
            chosen[name] = tensor
    records = {}
    for type_name, tensor in chosen.items():
        ne = [int(x) for x in tensor.shape]
        row_len = ne[0]
        block_elems, block_bytes, _ = LAYOUTS[type_name]
        row_bytes = row_len // block_elems * block_bytes
        flat = np.asarray(tensor.data).reshape(-1).view(np.uint8)
        n_rows = flat.size // row_bytes
        assert n_rows * row_bytes == flat.size, (tensor.name, flat.size, row_bytes)
        rows = sorted({0, n_rows - 1})
        records[type_name] = {
            "tensor": str(tensor.name),
            "ne": ne,
            "rows": [
                row_record("model:" + str(tensor.name), r, type_name,
                           flat[r * row_bytes:(r + 1) * row_bytes])
                for r in rows
            ],
        }
    return records


def q8_0_quantize_fixture(rng: np.random.Generator) -> dict:
    rows = []
    k = 256
    for i in range(6):
        x = rng.standard_normal(k).astype(np.float32) * np.float32(10.0 ** (i - 3))
        if i == 0:
            x[:32] = 0.0  # an all-zero block: d = 0, all quants 0
        if i == 1:
            # exact halves after scaling exercise round-half-away-from-zero
            x[32:64] = (np.arange(32, dtype=np.float32) - 16.0) * np.float32(0.5)
            x[32] = np.float32(127.0 * 0.5)
        q = quantize(x.reshape(1, -1), T.Q8_0).reshape(-1)
        rows.append({
            "input_f32_bits": f32_bits_hex(x),
            "q8_0_hex": q.astype(np.uint8).tobytes().hex(),
        })
    return {
        "generator": "gguf %s gguf.quants.quantize(x, Q8_0)" % gguf_version(),
        "row_len": k,
        "rows": rows,
    }


def weight_quantize_fixture(type_name: str) -> dict:
    rng = np.random.default_rng([SEED, int(T[type_name]), 1])
    rows = []
    k = 256
    for i in range(6):
        x = rng.standard_normal(k).astype(np.float32) * np.float32(10.0 ** (i - 3))
        if i == 0:
            x[:32] = 0.0  # an all-equal block: d = 0
            x[32:64] = 1.5  # all equal and non-zero
        if i == 1:
            x[32:64] = np.arange(32, dtype=np.float32) * np.float32(0.5)  # exact level halves
        if type_name in ("TQ1_0", "TQ2_0"):  # one 256-weight block per row
            if i == 2:
                x[:] = 0.0  # an all-zero block: d = 0
            if i == 3:
                x[0] = 8.0  # amax a power of two, so x/amax = ±1/2 exactly: rounding ties
                x[1:9] = [4.0, -4.0] * 4
        q = quantize(x.reshape(1, -1), T[type_name]).reshape(-1)
        rows.append({
            "input_f32_bits": f32_bits_hex(x),
            "quantized_hex": q.astype(np.uint8).tobytes().hex(),
        })
    return {
        "generator": "gguf %s gguf.quants.quantize(x, %s)" % (gguf_version(), type_name),
        "type": type_name,
        "row_len": k,
        "rows": rows,
    }


def gguf_version() -> str:
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:  # pragma: no cover - only metadata lookup
        return "unknown"


def write_json(path: str, obj: dict) -> None:
    """Deterministic JSON: header keys on their own lines, one row per line."""
    rows = obj.pop("rows")
    lines = ["{"]
    for key, value in obj.items():
        lines.append("  %s: %s," % (json.dumps(key), json.dumps(value, separators=(",", ":"))))
    lines.append('  "rows": [')
    for i, row in enumerate(rows):
        sep = "," if i + 1 < len(rows) else ""
        lines.append("    " + json.dumps(row, separators=(",", ":")) + sep)
    lines.append("  ]")
    lines.append("}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    model_path, out_dir = sys.argv[1], sys.argv[2]
    version = gguf_version()
    if version != GGUF_VERSION_EXPECTED:
        print("warning: gguf %s, fixtures were made with %s" % (version, GGUF_VERSION_EXPECTED),
              file=sys.stderr)
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(SEED)
    from_model = model_rows(model_path)
    model_name = os.path.basename(model_path)
    for type_name in LAYOUTS:
        rows = []
        source = {}
        if type_name in from_model:
            rows.extend(from_model[type_name]["rows"])
            source = {"model": model_name, "tensor": from_model[type_name]["tensor"],
                      "ne": from_model[type_name]["ne"]}
        n_blocks = SYNTHETIC_BLOCKS_PER_ROW[type_name]
        type_rng = (np.random.default_rng([SEED, int(T[type_name])])
                    if type_name in LATER_TYPES else rng)
        for r in range(SYNTHETIC_ROWS):
            raw = synthetic_raw(type_rng, type_name, n_blocks)
            rows.append(row_record("synthetic:seed=%d" % SEED, r, type_name, raw))
        obj = {
            "type": type_name,
            "type_id": int(T[type_name]),
            "generator": "gguf %s gguf.quants.dequantize" % version,
            "source": source,
            "rows": rows,
        }
        write_json(os.path.join(out_dir, type_name.lower() + ".json"), obj)
    write_json(os.path.join(out_dir, "q8_0_quantize.json"), q8_0_quantize_fixture(rng))
    for type_name in ("Q4_1", "Q5_1", "MXFP4", "TQ2_0", "TQ1_0"):
        write_json(os.path.join(out_dir, type_name.lower() + "_quantize.json"),
                   weight_quantize_fixture(type_name))
    print("wrote %d files to %s" % (len(LAYOUTS) + 6, out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
