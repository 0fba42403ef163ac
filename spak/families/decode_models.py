"""The fmha_decode family's model shape sets (issue 33): the attention head configurations
of widely served models, crossed with serving batches, cache lengths and cache layouts.

Head counts are from each model's published config.json on the Hugging Face hub
(num_attention_heads, num_key_value_heads, head_dim or hidden_size / heads):

    model             Hq   Hkv  D    group   config
    llama3.1-8b       32   8    128  4       meta-llama/Llama-3.1-8B
    llama3.1-70b      64   8    128  8       meta-llama/Llama-3.1-70B
    llama3.1-405b     128  8    128  16      meta-llama/Llama-3.1-405B
    qwen2.5-7b        28   4    128  7       Qwen/Qwen2.5-7B (hidden 3584)
    qwen2.5-14b       40   8    128  5       Qwen/Qwen2.5-14B (hidden 5120)
    qwen2.5-72b       64   8    128  8       Qwen/Qwen2.5-72B
    qwen3-8b          32   8    128  4       Qwen/Qwen3-8B (head_dim 128)
    qwen3-235b-a22b   64   4    128  16      Qwen/Qwen3-235B-A22B
    mistral-7b        32   8    128  4       mistralai/Mistral-7B-v0.3
    mistral-large     96   8    128  12      mistralai/Mistral-Large-Instruct-2407 (hidden 12288)
    mixtral-8x7b      32   8    128  4       mistralai/Mixtral-8x7B-v0.1
    mixtral-8x22b     48   8    128  6       mistralai/Mixtral-8x22B-v0.1
    gemma2-9b         16   8    256  2       google/gemma-2-9b (head_dim 256)
    gemma2-27b        32   16   128  2       google/gemma-2-27b (head_dim 128)
    phi3-mini         32   32   96   1       microsoft/Phi-3-mini-4k-instruct (hidden 3072)
    phi3-medium       40   10   128  4       microsoft/Phi-3-medium-4k-instruct (hidden 5120)
    yi-34b            56   8    128  7       01-ai/Yi-34B (hidden 7168)
    falcon-7b         71   1    64   71      tiiuae/falcon-7b (multi_query, hidden 4544)
    llama2-7b         32   32   128  1       meta-llama/Llama-2-7b-hf (MHA)
    gpt2              12   12   64   1       openai-community/gpt2 (MHA)

"models" is a documented sample, not the full cross product (20 models x 4 batches x 5
lengths x 2 length patterns x 4 layouts x 2 query counts x 2 dtypes = 12,800 cases): every
model at every (batch in {1, 8, 32, 128}, cache in {1k, 4k, 16k, 64k, 128k}) whose K+V fit
MAX_KV_BYTES (8 GiB: a timed run rotates several input sets on one 80 GB GPU), and for
each such (model, batch, cache) ONE layout / length pattern / query count, chosen by a
fixed rotation over the cell's index (so every model sees contiguous, 16-, 64- and 256-key
pages, equal and ragged lengths, Sq 1 and 4, and every layout meets every batch and
length across models). dtype stays open (`--dtype all` runs fp16 and bf16). Sq 4 is
causal (speculative decoding), Sq 1 non-causal. Ragged lengths: the `ragged` qualifier
(sequence b holds Sk - (b * 2654435761 mod 2^32) * (3 Sk / 4) / 2^32 keys: from Sk down
to Sk / 4, sequence 0 full).

"models-sweep": one shape per tuned-store key the models reach, (D, group) x Sq {1, 4} x
{contiguous, 64-key pages} (the store files fmha_decode configs under dtype, D, group, Sq,
paged; dtype open): 13 head configurations x 4 = 52 shapes at batch 8 and 16k keys, each
named by the first model of its configuration. What `spak sweep --family fmha_decode
--shapes models-sweep` tunes.

"models-gate": 20 shapes, one of "models" per model (models_gate says how they are
picked: half of them contiguous with full lengths and one query, the form SDPA and TileGym
have, the others each of the seven other variants in turn): the slice of the gate
`spak run --family fmha_decode --shapes models` that one GPU times in about two minutes
(tools/decode_gate_plan.py estimates both). "models-pages": two models' shapes contiguous
and in 16-, 64- and 256-key pages (paged against contiguous).

"models-small": 14 shapes for quick GPU runs, picked by hand to cover every group size
(1, 2, 4, 5, 7, 8, 12, 16, 71), D 64 / 96 / 128 / 256, every layout, ragged lengths, Sq 4,
batches 1-128 and caches 4k-64k.
"""
from __future__ import annotations

__all__ = ["MODELS", "MAX_KV_BYTES", "models_set", "models_small", "models_sweep",
           "models_gate", "models_pages", "ragged_lens"]

#: name -> (Hq, Hkv, D), from the published configs (module docstring)
MODELS: dict[str, tuple[int, int, int]] = {
    "llama3.1-8b": (32, 8, 128), "llama3.1-70b": (64, 8, 128),
    "llama3.1-405b": (128, 8, 128), "qwen2.5-7b": (28, 4, 128), "qwen2.5-14b": (40, 8, 128),
    "qwen2.5-72b": (64, 8, 128), "qwen3-8b": (32, 8, 128), "qwen3-235b-a22b": (64, 4, 128),
    "mistral-7b": (32, 8, 128), "mistral-large": (96, 8, 128),
    "mixtral-8x7b": (32, 8, 128), "mixtral-8x22b": (48, 8, 128), "gemma2-9b": (16, 8, 256),
    "gemma2-27b": (32, 16, 128), "phi3-mini": (32, 32, 96), "phi3-medium": (40, 10, 128),
    "yi-34b": (56, 8, 128), "falcon-7b": (71, 1, 64), "llama2-7b": (32, 32, 128),
    "gpt2": (12, 12, 64),
}
BATCHES = (1, 8, 32, 128)
CACHES = (1024, 4096, 16384, 65536, 131072)
#: the largest K+V a model-set case holds (fp16/bf16): several timed input sets of it
#: must fit one 80 GB GPU beside the peers' workspaces
MAX_KV_BYTES = 8 << 30
#: (layout qualifier, ragged, Sq) rotated over a model's (batch, cache) cells
_ROTATION = [("", False, 1), ("/page16", True, 1), ("/page64", False, 4),
             ("/page256", True, 1), ("", True, 4), ("/page256", False, 1),
             ("/page16", False, 4), ("/page64", True, 1)]


def ragged_lens(B: int, Sk: int) -> tuple[int, ...]:
    """The `ragged` qualifier's lengths: Sk down to Sk / 4 by a multiplicative hash of b
    (sequence 0 full: the GPU loop's simulator slice takes sequence 0)."""
    span = (3 * Sk) // 4
    return tuple(Sk - ((b * 2654435761) % (1 << 32)) * span // (1 << 32) for b in range(B))


def _shape(model, B, Sk, layout="", ragged=False, Sq=1) -> str:
    hq, hkv, d = MODELS[model]
    seq = f"{Sk}" if Sq == 1 else f"{Sq}:{Sk}"
    quals = layout + ("/ragged" if ragged else "") + ("/causal" if Sq > 1 else "/noncausal")
    return f"{B}x{hq}:{hkv}x{seq}x{d}{quals}/model={model}"


def _fits(model, B, Sk) -> bool:
    _, hkv, d = MODELS[model]
    return B * Sk * hkv * 2 * d * 2 <= MAX_KV_BYTES


def _cells(model) -> list[tuple[int, int]]:
    return [(b, s) for b in BATCHES for s in CACHES if _fits(model, b, s)]


def models_set() -> list[str]:
    """Every model at every fitting (batch, cache), one rotated variant a cell."""
    out = []
    for m_i, model in enumerate(MODELS):
        for c_i, (b, s) in enumerate(_cells(model)):
            layout, ragged, sq = _ROTATION[(m_i + c_i) % len(_ROTATION)]
            out.append(_shape(model, b, s, layout, ragged, sq))
    return out


def models_gate() -> list[str]:
    """One shape of `models` per model (module docstring): even-numbered models a cell of
    the first variant (contiguous, full lengths, Sq 1: the one SDPA and TileGym have a
    form of), odd-numbered ones the other seven variants in turn; among the model's cells
    of that variant, the one at (model index // 2) modulo their count, so batches and
    cache lengths spread. Every shape is one of `models`, planned as there."""
    out = []
    for m_i, model in enumerate(MODELS):
        want = 0 if m_i % 2 == 0 else 1 + (m_i // 2) % (len(_ROTATION) - 1)
        cells = _cells(model)
        picks = [c for c in range(len(cells)) if (m_i + c) % len(_ROTATION) == want]
        b, s = cells[picks[(m_i // 2) % len(picks)]]
        layout, ragged, sq = _ROTATION[want]
        out.append(_shape(model, b, s, layout, ragged, sq))
    return out


#: models_pages' shapes: (model, batch, cache), one query, full lengths
_PAGES = (("qwen2.5-7b", 8, 16384), ("llama3.1-8b", 32, 4096))


def models_pages() -> list[str]:
    """Paged against contiguous (issue 33's 5% / 10% target): each of _PAGES contiguous
    and in 16-, 64- and 256-key pages, one query, every sequence full (dtype open)."""
    return [_shape(m, b, s, layout) for m, b, s in _PAGES
            for layout in ("", "/page16", "/page64", "/page256")]


def models_sweep() -> list[str]:
    """One shape per (D, group, Sq, paged) store key of the models (module docstring)."""
    first: dict = {}
    for model, (hq, hkv, d) in MODELS.items():
        first.setdefault((d, hq // hkv), model)
    return [_shape(model, 8, 16384, layout, False, sq) for model in first.values()
            for sq in (1, 4) for layout in ("", "/page64")]


def models_small() -> list[str]:
    """The quick subset (module docstring)."""
    return [
        _shape("qwen2.5-7b", 4, 32768),                       # group 7, the 0.29
        _shape("qwen2.5-14b", 48, 4096, "/page64", True),     # group 5, ragged, paged
        _shape("yi-34b", 8, 16384, "/page256"),               # group 7, 256-key pages
        _shape("mistral-large", 8, 16384),                    # group 12
        _shape("mixtral-8x22b", 32, 4096, "/page16"),         # group 6, 16-key pages
        _shape("falcon-7b", 8, 16384),                        # MQA group 71, D 64
        _shape("falcon-7b", 1, 65536, Sq=4),                  # MQA 71, speculative
        _shape("llama3.1-8b", 128, 4096),                     # group 4, big batch
        _shape("llama3.1-70b", 4, 16384, Sq=4),               # group 8, Sq 4
        _shape("qwen3-235b-a22b", 1, 65536, "/page64"),       # group 16, one sequence
        _shape("gemma2-9b", 8, 16384),                        # D 256, group 2
        _shape("phi3-mini", 8, 4096, "", True),               # D 96, MHA, ragged
        _shape("llama2-7b", 1, 16384),                        # MHA D 128
        _shape("gpt2", 32, 1024, "/page16"),                  # MHA D 64, 16-key pages
    ]
