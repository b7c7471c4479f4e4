"""The speedrun's tokenizer spells a file's path with the same tokens in the prompt's code header and in the diff the
model writes, so that naming the file is a copy. Under Qwen2's split it never was (` unidiff` in the header,
`/`, `unidiff` in `diff --git a/unidiff/...`), and the speedrun's model wrote the header's token into its diffs."""

from __future__ import annotations

import json
import lzma
import sys
import sysconfig
from pathlib import Path

import pytest
from tokenizers import Regex, pre_tokenizers

from workshop.tinymodel import QWEN_SPLIT_PATTERN

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "speedrun"))
import corpus  # noqa: E402
import fixes  # noqa: E402
import lm  # noqa: E402

# Held-out paths of the speedrun's task set: a package folder, a `src/` layout, a single-module project.
PATHS = ["unidiff/patch.py", "pathspec/util.py", "src/isodate/duration.py", "xmltodict.py", "my_pkg/_impl.py"]


@pytest.mark.parametrize("path", PATHS)
def test_the_split_spells_a_path_alike_in_the_header_and_in_the_diff(path: str) -> None:
    header, diff = fixes.header_and_diff(path)
    for pattern, alike in ((corpus.PATH_SPLIT_PATTERN, True), (QWEN_SPLIT_PATTERN, False)):
        split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
        in_header = fixes.mentions(split.pre_tokenize_str(header), header, path)
        in_diff = fixes.mentions(split.pre_tokenize_str(diff), diff, path)
        assert len(in_header) == 2 and len(in_diff) == 4  # [start of]/[end of]; diff --git a/ b/, ---, +++
        runs = {tuple(r) for r in in_header + in_diff}
        assert (len(runs) == 1 and [] not in in_header + in_diff) is alike, (pattern, runs)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The speedrun's tokenizer trained on a few standard-library modules; its folder."""
    root = tmp_path_factory.mktemp("tokenizer")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    (root / "corpus").mkdir()
    with lzma.open(root / "corpus" / "train.jsonl.xz", "wt") as f:
        for name in ("textwrap.py", "shlex.py", "fnmatch.py"):
            f.write(json.dumps({"package": "stdlib", "path": name, "text": (stdlib / name).read_text()}) + "\n")
    return corpus.train_tokenizer(root / "corpus", root / "corpus" / "tokenizer", vocab_size=512)


@pytest.fixture(scope="module")
def model_folder(trained: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen2 model folder with the trained tokenizer, made as the speedrun makes the model it pre-trains: every
    GPU stage (pre-training, SFT, the fleet) loads its tokenizer from such a folder."""
    shape = {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate": 64}
    return lm.make_model(trained, tmp_path_factory.mktemp("model") / "init", shape, max_positions=256)


def test_a_model_folder_tokenises_with_the_trained_split(trained: Path, model_folder: Path) -> None:
    """transformers' Qwen2Tokenizer puts Qwen2's split in place of the file's: the ninth run pre-trained, fine-tuned
    and ran GRPO that way. The speedrun's own tokenisation of a model folder is the file's, ids for ids."""
    from tokenizers import Tokenizer

    texts = [fixes.header_and_diff(path)[i] for path in PATHS for i in (0, 1)]
    stream, _ = lm.tokenize_corpus(model_folder, iter(texts))
    file = Tokenizer.from_file(str(trained / "tokenizer.json"))
    eot = file.token_to_id("<|endoftext|>")
    assert stream.tolist() == [i for t in texts for i in [*file.encode(t, add_special_tokens=False).ids, eot]]


def test_the_trained_tokenizer_writes_a_header_path_token_for_token_in_the_diff(model_folder: Path) -> None:
    from fleet.tokenizer import load_tokenizer

    tok = load_tokenizer(model_folder)
    for path in PATHS:
        spellings = fixes.path_spelling(tok, path)
        assert len(spellings) == 6 and len(set(spellings)) == 1 and spellings[0], (path, spellings)


def test_answers_are_diagnosed_only_with_the_tokenizer_that_wrote_them(trained: Path, tmp_path: Path) -> None:
    """A report's answers are token ids; decoded with another tokenizer they read as garbage, so the diagnosis
    refuses a data folder whose tokenizer is not the report's, and names it."""
    import report

    from fleet.tokenizer import load_tokenizer
    from workshop.tinymodel import _save_tokenizer, _train_tokenizer, tokenizer_fingerprint

    # A model folder's copy of the tokenizer (saved again, as SFT saves it) has the same fingerprint.
    load_tokenizer(trained).save_pretrained(tmp_path / "model")
    assert tokenizer_fingerprint(tmp_path / "model") == tokenizer_fingerprint(trained)
    report.check_tokenizer(trained.parent.parent, tokenizer_fingerprint(tmp_path / "model"))
    # Runs 1-8's tokenizer: Qwen2's split, the same texts.
    old = tmp_path / "old" / "corpus" / "tokenizer"
    _save_tokenizer(_train_tokenizer(512, corpus.read_texts(trained.parent / "train.jsonl.xz")), old)
    with pytest.raises(ValueError, match=f"{tmp_path / 'old'}/corpus/tokenizer is"):
        report.check_tokenizer(tmp_path / "old", tokenizer_fingerprint(trained))
