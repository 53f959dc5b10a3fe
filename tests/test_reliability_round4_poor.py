"""Issue 55's poor classes, each with the real part: stdout on a full device (/dev/full and a node made by mknod), a
full KVLAB_CACHE_DIR (a real file-size limit, RLIMIT_FSIZE, in a subprocess), real SIGTERMs while the first one's
releases run, a 1 MB value echoed in an error, settings a model's config declares that kvlab does not apply, an
empty chat-template render, NaN logits on every token path, and CLI settings that were silently dropped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kvlab
from kvlab.cli import main
from kvlab.ort.models.describe import describe

KVLAB = str(Path(sys.executable).parent / "kvlab")
REPO = Path(__file__).resolve().parents[1]


def _lines(err: str) -> list[str]:
    """stderr's lines, tqdm's redraws left out."""
    return [
        line for line in err.replace("\r", "\n").splitlines() if line.startswith("kvlab:") and "building" not in line
    ]


# -- stdout on a device that takes no more bytes
def _full_device(tmp_path: Path) -> Path:
    """A character device node like /dev/full (1, 7), made with mknod in ``tmp_path`` (root); /dev/full otherwise."""
    node = tmp_path / "full"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
        return node
    except PermissionError:
        return Path("/dev/full")


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("argv", [["generate", "hi", "--max-new-tokens", "2", "--json"], ["inspect", "toy"]])
def test_stdout_on_a_full_device_is_one_line_and_exit_2(tmp_path, argv, unbuffered):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | (
        {"PYTHONUNBUFFERED": "1"} if unbuffered else {}
    )
    with open(_full_device(tmp_path), "w") as full:
        r = subprocess.run([KVLAB, *argv], stdout=full, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert _lines(r.stderr) == [_lines(r.stderr)[0]] and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "stdout" in r.stderr and "No space left on device" in r.stderr and "internal error" not in r.stderr


# -- a full KVLAB_CACHE_DIR: the file-size limit makes writes fail with EFBIG, honestly
FULL_CACHE = textwrap.dedent(
    """
    import json, os, resource, sys
    from pathlib import Path
    import kvlab
    from kvlab.core.paths import write_atomic
    from kvlab.presets.recipes import building
    folder = Path(sys.argv[1])
    (folder / "old.json").write_text("old")
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
    out = {}
    try:
        with building(folder / "models" / "m", "done") as tmp:
            (tmp / "weights").write_bytes(b"x" * 3000)
            (tmp / "more").write_bytes(b"x" * 100_000)  # over the limit: EFBIG
            (tmp / "done").write_text("")
    except kvlab.KvlabError as exc:
        out["build"] = [type(exc).__name__, str(exc)]
    try:
        write_atomic(folder / "old.json", "x" * 100_000)
    except kvlab.KvlabError as exc:
        out["write"] = [type(exc).__name__, str(exc)]
    print(json.dumps(out))
    """
)


def test_a_full_cache_dir_names_the_folder_and_the_room_and_keeps_nothing_half_written(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / "models" / f".m-{int(dead.stdout)}-killed"  # the scratch of a build killed before (SIGKILL)
    stale.mkdir(parents=True)
    (stale / "weights").write_bytes(b"half")
    r = subprocess.run([sys.executable, "-c", FULL_CACHE, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    kind, message = out["build"]
    assert kind == "ModelError" and str(tmp_path / "models") in message and "bytes free" in message, message
    assert "limited to 4096 bytes" in message and "KVLAB_CACHE_DIR" in message, message
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == []  # no scratch left, the killed one's neither
    kind, message = out["write"]
    assert kind == "ConfigError" and "cannot write 100000 bytes" in message and "File too large" in message, message
    assert (tmp_path / "old.json").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == [
        "models",
        "old.json",
    ]


# -- a second SIGTERM while the first one's releases run
def _running(pid: int) -> bool:
    """Whether process ``pid`` has loaded ONNX Runtime (its command is under way)."""
    try:
        return "onnxruntime" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("gap", [0.0, 0.005, 0.02])
def test_sigterms_during_the_first_ones_teardown_still_exit_130_with_one_line(gap):
    """Real signals: one SIGTERM while the generation runs, then more every ``gap`` seconds until the process is
    gone (they land in its releases and in Python's teardown): 130 and one line, never killed by the signal."""
    proc = subprocess.Popen(
        [KVLAB, "generate", "hi", "--max-new-tokens", "4000", "--ignore-eos", "--cache", "static@4096"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not _running(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        while proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            time.sleep(gap)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert len(_lines(err)) == 1 and _lines(err)[0].startswith("kvlab: interrupted") and "Traceback" not in err, err


def test_the_handlers_main_installed_are_given_back_to_an_in_process_caller(toy, capsys):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert main(["generate", "hi", "--max-new-tokens", "1"]) == 0
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


# -- a 1 MB value echoed in an error
def test_a_huge_value_is_clipped_in_every_kvlab_error(toy):
    huge = "x" * 1_000_000
    with pytest.raises(kvlab.KvlabError) as err:
        kvlab.load(huge)
    assert len(str(err.value)) < 600 and "characters left out" in str(err.value)
    assert str(err.value).endswith("nor an existing directory")  # what would be valid is kept
    with pytest.raises(kvlab.KvlabError) as err:
        kvlab.make_cache(huge)
    assert len(str(err.value)) <= 2100, len(str(err.value))


def test_a_huge_set_value_on_the_command_line_is_one_short_line():
    value = "y" * 100_000  # a command-line argument holds at most 128 KiB
    r = subprocess.run([KVLAB, "bench", "--set", f"contexts={value}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr) < 1000 and "characters left out" in r.stderr, r.stderr[:500]


def test_a_type_function_that_raised_is_not_named_by_its_python_name():
    r = subprocess.run([KVLAB, "generate", "--cache", "static@" + "9" * 5000], capture_output=True, text=True)
    assert r.returncode == 2 and "cache_names" not in r.stderr and "invalid" not in r.stderr, r.stderr[:300]
    assert "'static@99" in r.stderr and "choose dynamic, static, static@N" in r.stderr, r.stderr[-300:]


# -- an empty chat-template render
@pytest.fixture
def empty_template(toy, tmp_path):
    """A copy of the toy whose chat template renders "" for any messages."""
    out = tmp_path / "empty-template"
    shutil.copytree(toy.info.path, out, ignore=shutil.ignore_patterns("*.kvlab-*"))
    (out / "chat_template.jinja").write_text("{% for m in messages %}{% endfor %}")
    return out


def test_an_empty_chat_template_render_names_the_template_and_the_messages(empty_template):
    model = kvlab.load(empty_template)
    with pytest.raises(kvlab.ModelError, match=r"chat_template.jinja\) rendered nothing for 1 message"):
        kvlab.generate(model, [{"role": "user", "content": "hi"}], max_new_tokens=2)
    with kvlab.Conversation(model) as chat, pytest.raises(kvlab.ModelError, match="rendered nothing"):
        chat.say("hi", 2)
    r = subprocess.run(
        [KVLAB, "chat", "--model", str(empty_template), "--turn", "hi"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and _lines(r.stderr) == [_lines(r.stderr)[0]] and "rendered nothing" in r.stderr


# -- chat: a size the user never gave, and a scripted /back that failed
def test_chat_says_where_a_size_it_chose_came_from():
    r = subprocess.run(
        [KVLAB, "chat", "--turn", "hi", "--max-new-tokens", "3000"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and "2048 is chat's default, --cache static@2048: give --cache static@N" in r.stderr


def test_a_scripted_back_that_fails_exits_2():
    r = subprocess.run(
        [KVLAB, "chat", "--turn", "/back", "--turn", "hi", "--max-new-tokens", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "no turn yet" in r.stderr and r.stdout == "", (r.returncode, r.stderr)


# -- make_cache: every part of a spec's variant made or refused by name
PARTS = ["kv-int8", "kv-int4", "states-in-place", "states-swap", "checked/4", "ring", "graph", "4KiB-pages"]


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_make_cache_makes_or_refuses_every_pair_of_variant_parts(kind):
    from itertools import combinations

    from kvlab.core.labels import CacheSpec

    for a, b in combinations(PARTS, 2):
        spec = CacheSpec(kind, 64 if kind == "static" else None, f"{a}+{b}")
        try:
            made = kvlab.make_cache(spec).spec
        except kvlab.ConfigError as exc:
            assert any(p in str(exc) for p in (a, b, "kv_precision")), (spec, exc)
            continue
        parts = set(filter(None, made.variant.split("+"))) | {"states-swap"}
        assert {a, b} <= parts and made.max_cache_len == spec.max_cache_len, (spec, made)


# -- what a model's config declares: done as it says and said, or refused by name
def _with_config(toy, tmp_path: Path, **model_keys) -> Path:
    """A copy of the toy whose genai_config.json's "model" section has ``model_keys`` (``search`` for the search
    section)."""
    out = tmp_path / "configured"
    shutil.copytree(toy.info.path, out, ignore=shutil.ignore_patterns("*.kvlab-*"))
    config = json.loads((out / "genai_config.json").read_text())
    config["search"] = {**config.get("search", {}), **model_keys.pop("search", {})}
    config["model"].update(model_keys)
    (out / "genai_config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("eos", [[], None], ids=["empty", "null"])
def test_a_model_without_eos_says_so_and_runs_to_max_new_tokens(toy, tmp_path, eos):
    path = _with_config(toy, tmp_path, eos_token_id=eos)
    with pytest.warns(UserWarning, match=r"declares no EOS token .* only at max_new_tokens"):
        model = kvlab.load(path)
    assert model.info.eos_token_ids == () and "no EOS token" in describe(model.info)
    assert len(kvlab.generate(model, [1, 2, 3], max_new_tokens=5).token_ids) == 5
    argv = [KVLAB, "generate", "--model", str(path), "hi", "--max-new-tokens", "2"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and _lines(r.stderr) == [
        "kvlab: note: model configured: genai_config.json declares no EOS token "
        f"(eos_token_id {eos!r}): generation never stops on one, only at max_new_tokens"
    ], r.stderr


def test_a_search_section_that_samples_is_said_to_be_greedy_in_kvlab(toy, tmp_path):
    with pytest.warns(UserWarning, match=r"search section samples \(do_sample=true.*kvlab decodes greedily"):
        kvlab.load(_with_config(toy, tmp_path, search={"do_sample": True, "top_k": 5}))


@pytest.mark.parametrize("key", ["pad_token_id", "bos_token_id"])
@pytest.mark.parametrize("value", [10**6, -1, "1", True])
def test_a_malformed_pad_or_bos_id_is_refused_by_name(toy, tmp_path, key, value):
    with pytest.raises(kvlab.ModelError, match=rf"{key} {value!r:.10}.* must be a token id in the vocabulary"):
        kvlab.load(_with_config(toy, tmp_path, **{key: value}))


# -- non-finite logits in the prefill on every token path, bursts of 1 and 8: the host path's ModelError
@pytest.fixture(scope="module")
def nan_prefill(toy, tmp_path_factory):
    import numpy as np
    import onnx
    from onnx import numpy_helper

    out = tmp_path_factory.mktemp("nan-prefill")
    for f in toy.info.path.iterdir():
        if f.is_file() and not f.name.startswith("model."):
            shutil.copy(f, out / f.name)
    graph = onnx.load(str(toy.info.path / "model.onnx"))
    for init in graph.graph.initializer:
        if init.name == "lm_head.MatMul.weight":
            weights = numpy_helper.to_array(init).copy()
            weights[:, 7] = np.inf  # one Inf weight column: every position's logit 7 is +-Inf or NaN
            init.CopyFrom(numpy_helper.from_array(weights, init.name))
    onnx.save(graph, str(out / "model.onnx"))
    return kvlab.load(out)


@pytest.mark.parametrize("per_read", [1, 8])
@pytest.mark.parametrize("where", [True, "blocks", "single", "rows", False])
def test_non_finite_prefill_logits_are_the_same_model_error_on_every_path(nan_prefill, where, per_read):
    if where is False and per_read > 1:
        pytest.skip("the host path reads every token")
    cache = kvlab.StaticCache(32)
    with pytest.raises(kvlab.ModelError, match=r"non-finite logits at step 0 \(position 5\)"):
        run = {"cache": cache, "token_on_device": where, "tokens_per_read": per_read}
        kvlab.generate(nan_prefill, [1, 2, 3, 4, 5, 6], max_new_tokens=4, **run)
    assert cache.seq_length == 0
    cache.dispose()


# -- the sweep's own finds
def test_an_endless_prompt_file_or_chat_line_is_refused_not_read_forever():
    r = subprocess.run([KVLAB, "generate", "--prompt-file", "/dev/zero"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "holds more than 16777216 bytes" in r.stderr, r.stderr[-500:]
    with open("/dev/zero") as zeros:
        r = subprocess.run([KVLAB, "chat"], stdin=zeros, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "a stdin line holds more than" in r.stderr, r.stderr[-500:]


def test_a_table_setting_names_its_values_and_a_file_is_not_called_missing(tmp_path):
    r = subprocess.run([KVLAB, "generate", "--device-option", "spinning=maybe", "hi"], capture_output=True, text=True)
    assert r.returncode == 2 and "'maybe' is not a valid spinning; choose one of on, off" in r.stderr, r.stderr
    (tmp_path / "model.onnx").write_bytes(b"")
    with pytest.raises(kvlab.ModelError, match="is a file, not a directory"):
        kvlab.load(tmp_path / "model.onnx")


def test_a_full_device_as_out_is_named_without_a_disk_s_room(tmp_path):
    r = subprocess.run(
        [KVLAB, "trace", "--steps", "2", "--out", str(_full_device(tmp_path))], capture_output=True, text=True
    )
    assert r.returncode == 2 and "No space left on device" in r.stderr and "bytes free" not in r.stderr, r.stderr


def test_a_cache_size_too_small_is_named_by_the_flag_the_user_gave():
    r = subprocess.run([KVLAB, "compare", "--cache", "dynamic,static@8", "hi"], capture_output=True, text=True)
    assert r.returncode == 2 and "--cache static@8 holds 8 positions; this run needs" in r.stderr, r.stderr
    assert "StaticCache(" not in r.stderr


@pytest.mark.parametrize("argv", [["profile", "ops", "--steps", "0"], ["chat-bench", "--set", "x=1"]])
def test_an_unknown_argument_points_at_its_subcommand_s_help(argv):
    r = subprocess.run([KVLAB, *argv], capture_output=True, text=True, timeout=120)
    where = " ".join(argv[:2] if argv[0] == "profile" else argv[:1])
    assert r.returncode == 2 and r.stderr.startswith(f"kvlab: error: {where}: unrecognized arguments"), r.stderr
    assert r.stderr.rstrip().endswith(f"(see kvlab {where} --help)"), r.stderr
