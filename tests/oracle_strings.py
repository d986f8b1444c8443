"""Generated allocator-config strings for the differential tests against torch's parser.

The generator decides, independently of our parser, whether each string is
*well-formed*: it knows when it injected something torch would misread
(signs, exponents or decimals in integers, trailing junk, glued words,
clamped sizes, unsorted or lone-'>' lists) or a structural slip (trailing
commas, '=' ...). Used by tests/unit/test_torch_oracle.py (CPU torch,
generic keys) and tests/gpu/test_torch_oracle_gpu.py (CUDA torch, every key).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

MAX_MIB = ((1 << 64) - 1) // (1 << 20)

SIZE_CLEAN = ["0", "1", "10", "11", "19", "20", "21", "32", "64", "100", "128", "512", "4096",
              "65536", "2147483647", "2147483648", str(1 << 40), str(MAX_MIB), "0128"]
SIZE_NOISE = ["-5", "-1", "1e3", "12.5", "+128", "0x10", "abc", "128MB", str(MAX_MIB + 1),
              "18446744073709551615", "99999999999999999999", "1 28"]
FLOAT_CLEAN = ["0", "0.0", "0.5", ".5", "1", "1.0", "0.999", "6e-1", "1e-5", "2", "00.3", "0.6"]
FLOAT_NOISE = ["0.5x", "nan", "inf", "-0.1", "abc", "0,5", "0.5.1", "1e-400x"]
BOOL_CLEAN = ["True", "False"]
BOOL_NOISE = ["true", "false", "1", "0", "yes", "TRUE", "Tr ue", "[True]"]

@dataclass
class Case:
    text: str
    well_formed: bool


def _size(rng: random.Random) -> tuple[str, bool]:
    if rng.random() < 0.25:
        return rng.choice(SIZE_NOISE), False
    if rng.random() < 0.3:
        return str(rng.randint(0, 200_000)), True
    return rng.choice(SIZE_CLEAN), True


def _roundup(rng: random.Random) -> tuple[str, bool]:
    roll = rng.random()
    if roll < 0.3:
        return str(rng.choice([0, 1, 2, 3, 4, 6, 8, 16, 64, 1 << 31, 1 << 40])), True
    bands = sorted(rng.sample(range(16), rng.randint(1, 4)))
    items = [f"{1 << b}:{rng.choice([0, 1, 2, 3, 4, 8, 16])}" for b in bands]
    if rng.random() < 0.5:
        items.append(f">:{rng.choice([0, 1, 2, 5, 8])}")
    well_formed = True
    mutation = rng.random()
    if mutation < 0.08:
        items.reverse()
        well_formed = len(items) < 2
    elif mutation < 0.14:
        items.insert(0, f">:{rng.choice([1, 2])}")
        well_formed = False
    elif mutation < 0.2:
        items[0] = f"{rng.choice([0, 3, 65536, 131072])}:2"
        well_formed = False
    elif mutation < 0.24:
        return "[" + ",".join(items) + ",]", False
    elif mutation < 0.27:
        return "[]", False
    return "[" + ",".join(items) + "]", well_formed


BOOL_KEYS = {"expandable_segments", "pinned_use_background_threads", "release_lock_on_cudamalloc",
             "pinned_use_cuda_host_register", "graph_capture_record_stream_reuse",
             "throw_on_cudamalloc_oom", "pinned_free_catch_all"}


def _value(key: str, rng: random.Random) -> tuple[str, bool]:
    if key == "per_process_memory_fraction":
        noise = rng.random() < 0.25
        return rng.choice(FLOAT_NOISE if noise else FLOAT_CLEAN), not noise
    if key == "pinned_num_register_threads":
        return rng.choice(["1", "2", "3", "64", "128", "256", "0"]), True
    if key in BOOL_KEYS:
        noise = rng.random() < 0.25
        return rng.choice(BOOL_NOISE if noise else BOOL_CLEAN), not noise
    if key == "garbage_collection_threshold":
        noise = rng.random() < 0.25
        return rng.choice(FLOAT_NOISE if noise else FLOAT_CLEAN), not noise
    if key == "roundup_power2_divisions":
        return _roundup(rng)
    if key == "large_segment_size_mb" and rng.random() < 0.7:
        return rng.choice(["5", "10", "11", "16", "20", "32", "64", "128"]), True
    return _size(rng)


def make_case(rng: random.Random, keys: Sequence[str]) -> Case:
    items, well_formed = [], True
    for _ in range(rng.randint(1, 4)):
        key = rng.choice(list(keys))
        value, ok = _value(key, rng)
        well_formed &= ok
        items.append(f"{key}:{value}")
    text = ",".join(items)
    slip = rng.random()
    if slip < 0.04:
        text, well_formed = text.replace(":", "=", 1), False
    elif slip < 0.07:
        text, well_formed = text + ",", False
    elif slip < 0.09:
        text, well_formed = text.replace(",", ",,", 1) if "," in text else text + ",,", False
    elif slip < 0.12:
        text = text.replace(",", " , ").replace(":", ": ", 1)  # harmless spacing
    return Case(text, well_formed)


