import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from launch.data.recipe import DEFAULT_RECIPE, Recipe, load_recipe
from launch.data.sdist import SdistError, download_from_index, extract_sdist, fetch_sdist, index_url


def test_committed_recipe_loads_and_pins_eight_repositories():
    recipe = load_recipe()
    assert [r.name for r in recipe.repos] == ["toolz", "inflection", "tabulate", "slugify", "cachetools", "semver",
                                              "parse", "boltons"]
    assert recipe.fingerprint() == load_recipe(DEFAULT_RECIPE).fingerprint()
    semver = recipe.repo("semver")
    assert semver.test_command(["-q"], ["tests/test_a.py"]) == (
        "PYTHONHASHSEED=0 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONPATH=src:tests python -m pytest -q tests/test_a.py")
    with pytest.raises(KeyError, match="unknown repository 'numpy'"):
        recipe.repo("numpy")


def test_default_recipe_fingerprint_is_unchanged_by_the_unset_repository_split():
    # The value before `RepoRecipe.split` existed: a key left unset must not change what built the default set.
    assert load_recipe().fingerprint() == "6eccb5cee0c8b8ef"


SPEEDRUN = Path(__file__).parents[4] / "benchmarks" / "speedrun"


def test_speedrun_recipes_hold_out_whole_repositories_and_keep_sft_disjoint():
    tasks, sft = load_recipe(SPEEDRUN / "tasks.yaml"), load_recipe(SPEEDRUN / "sft.yaml")
    default = {r.name for r in load_recipe().repos}
    assert {r.name for r in tasks.repos if r.split == "train"} >= default
    assert len([r for r in tasks.repos if r.split == "validation"]) >= 5
    assert all(r.split is not None for r in tasks.repos)
    assert all(r.split == "train" for r in sft.repos)
    assert not {r.package for r in sft.repos} & {r.package for r in tasks.repos}
    with pytest.raises(ValueError, match="split"):
        Recipe.model_validate({**tasks.model_dump(by_alias=True),
                               "repos": [{**tasks.repos[0].model_dump(by_alias=True), "split": "test"}]})


def test_recipe_errors_name_the_field(tmp_path):
    raw = load_recipe().model_dump(by_alias=True)
    raw["repos"][0]["sha256"] = "xyz"
    with pytest.raises(ValueError, match="sha256"):
        Recipe.model_validate(raw)
    raw = load_recipe().model_dump(by_alias=True)
    raw["repos"][1]["name"] = raw["repos"][0]["name"]
    with pytest.raises(ValueError, match="names must be unique"):
        Recipe.model_validate(raw)
    bad = tmp_path / "r.yaml"
    bad.write_text("recipe_version: 1\npytest_args: []\nrepos: []\nsurprise: 1\n")
    with pytest.raises(ValueError, match="surprise"):
        load_recipe(bad)


def make_sdist(path: Path, members: dict[str, bytes]) -> str:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_cached_sdist_is_used_only_when_its_hash_matches(tmp_path):
    sha = make_sdist(tmp_path / "demo_pkg-1.0.tar.gz", {"demo_pkg-1.0/m.py": b"x = 1\n"})
    assert fetch_sdist("demo-pkg", "1.0", sha, tmp_path) == tmp_path / "demo_pkg-1.0.tar.gz"
    top = extract_sdist(tmp_path / "demo_pkg-1.0.tar.gz", tmp_path / "x")
    assert (top / "m.py").read_text() == "x = 1\n"


def test_archives_escaping_their_folder_are_refused(tmp_path):
    make_sdist(tmp_path / "evil-1.0.tar.gz", {"../outside.py": b"boom"})
    with pytest.raises(tarfile.TarError):
        extract_sdist(tmp_path / "evil-1.0.tar.gz", tmp_path / "x")
    assert not (tmp_path / "outside.py").exists()


def sdist_bytes(tmp_path: Path, name: str, members: dict[str, bytes]) -> bytes:
    make_sdist(tmp_path / name, members)
    return (tmp_path / name).read_bytes()


def pip_must_not_download(monkeypatch: pytest.MonkeyPatch) -> None:
    real_run = subprocess.run

    def run(cmd, **kw):  # type: ignore[no-untyped-def]
        assert "download" not in cmd, f"pip was asked to download: {cmd}"
        return real_run(cmd, **kw)

    monkeypatch.setattr("launch.data.sdist.subprocess.run", run)


def test_index_url_is_the_one_pip_is_configured_with(package_index):
    assert index_url() == package_index.url


def test_pinned_sdist_is_fetched_from_the_index_by_its_hash_without_pip(package_index, tmp_path, monkeypatch):
    sdist = sdist_bytes(tmp_path, "demo_pkg-1.0.tar.gz", {"demo_pkg-1.0/m.py": b"x = 1\n"})
    other = sdist_bytes(tmp_path, "demo_pkg-0.9.tar.gz", {"demo_pkg-0.9/m.py": b"x = 0\n"})
    package_index.publish("demo-pkg", {"demo_pkg-0.9.tar.gz": other, "demo_pkg-1.0-py3-none-any.whl": b"a wheel",
                               "demo_pkg-1.0.tar.gz": sdist})
    pip_must_not_download(monkeypatch)
    cache = tmp_path / "cache"
    # The recipe's spelling of the name is normalised (PEP 503) for the page's address.
    got = fetch_sdist("Demo_Pkg", "1.0", hashlib.sha256(sdist).hexdigest(), cache)
    assert got == cache / "demo_pkg-1.0.tar.gz" and got.read_bytes() == sdist
    assert package_index.requests == ["/simple/demo-pkg/", "/packages/demo_pkg-1.0.tar.gz"]
    assert [p.name for p in cache.iterdir()] == ["demo_pkg-1.0.tar.gz"]  # no download folder left behind
    # A second call is served by the cache, hash checked, without the index.
    assert fetch_sdist("demo-pkg", "1.0", hashlib.sha256(sdist).hexdigest(), cache) == got
    assert len(package_index.requests) == 2


def test_a_file_whose_bytes_differ_from_the_hash_the_index_lists_is_refused(package_index, tmp_path):
    sdist = sdist_bytes(tmp_path, "demo_pkg-1.0.tar.gz", {"demo_pkg-1.0/m.py": b"x = 1\n"})
    pinned = hashlib.sha256(b"what the recipe pinned").hexdigest()
    package_index.publish("demo-pkg", {"demo_pkg-1.0.tar.gz": sdist}, listed_sha={"demo_pkg-1.0.tar.gz": pinned})
    with pytest.raises(SdistError, match=r"demo-pkg/ lists demo_pkg-1.0.tar.gz with sha256 .* but the file it served"):
        fetch_sdist("demo-pkg", "1.0", pinned, tmp_path / "cache")
    assert not list((tmp_path / "cache").iterdir())


def test_an_index_without_json_pages_leaves_the_download_to_pip(package_index, tmp_path):
    package_index.pages["/simple/demo-pkg/"] = ("text/html", b"<html><a href='x'>demo_pkg-1.0.tar.gz</a></html>")
    assert download_from_index("demo-pkg", "1.0", "0" * 64, tmp_path) is None
    package_index.publish("other", {"other-1.0.tar.gz": b"bytes"})
    assert download_from_index("other", "1.0", "0" * 64, tmp_path) is None  # listed, but not with the pinned hash
    assert download_from_index("missing", "1.0", "0" * 64, tmp_path) is None  # 404
    assert not list(tmp_path.iterdir())


def test_download_failure_is_reported_with_pips_message(package_index, tmp_path, monkeypatch):
    real_run = subprocess.run

    def fake_run(cmd, **kw):
        if "download" not in cmd:
            return real_run(cmd, **kw)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for nope==9")

    monkeypatch.setattr("launch.data.sdist.subprocess.run", fake_run)
    with pytest.raises(SdistError, match="No matching distribution"):
        fetch_sdist("nope", "9", "0" * 64, tmp_path)
    assert package_index.requests == ["/simple/nope/"]
