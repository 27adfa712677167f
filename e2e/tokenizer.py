"""A tokenizer for a config-only model dir, generated (never downloaded).

SGLang's one-batch path always calls get_tokenizer, though the benchmark feeds token ids. We
write a model dir beside the run: the config.json, plus a word-level `tokenizer.json` (the
`tokenizers` library's serialized format) whose vocabulary is `t0 .. t{n-1}` and the config's
special tokens, and a `tokenizer_config.json` naming PreTrainedTokenizerFast, so
`AutoTokenizer.from_pretrained(dir)` loads it offline. The vocabulary is kept small: the model's
embedding size comes from config.json, not from the tokenizer.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from astra_sglang.errors import AstraError

SPECIALS = ("<unk>", "<s>", "</s>")


def tokenizer_json(n_words: int = 1000) -> dict:
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for i in range(n_words):
        vocab[f"t{i}"] = len(vocab)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(SPECIALS)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }


def tokenizer_config() -> dict:
    return {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
            "eos_token": "</s>", "model_max_length": 1 << 20, "clean_up_tokenization_spaces": False}


def model_dir_with_tokenizer(model_path: Path, dest: Path) -> Path:
    """DEST = MODEL_PATH's config.json (and any other small json it has) + a generated tokenizer.
    A model dir that already has a tokenizer is returned as it is."""
    model_path = Path(model_path)
    cfg = model_path / "config.json"
    if not cfg.is_file():
        raise AstraError(f"{cfg}: not found")
    if (model_path / "tokenizer.json").is_file() or (model_path / "tokenizer.model").is_file():
        return model_path
    if any(model_path.glob("*.safetensors")) or any(model_path.glob("*.bin")):
        raise AstraError(f"{model_path} has weights but no tokenizer: give --tokenizer-path")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for f in model_path.glob("*.json"):
        shutil.copyfile(f, dest / f.name)
    (dest / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    (dest / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=1))
    (dest / "special_tokens_map.json").write_text(json.dumps(
        {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}, indent=1))
    return dest
