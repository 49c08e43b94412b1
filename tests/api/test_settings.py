"""Options are defined once (superggml.settings): Model's signature, the CLI flags and SUPERGGML_* come from them."""

from __future__ import annotations

import dataclasses
import os
import inspect

import pytest

from superggml import Model, settings
from superggml.commands import cli
from superggml.settings import ContextSettings, KVSettings, PagingSettings, Settings


def _help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    return capsys.readouterr().out


def test_every_option_has_a_flag_an_env_var_and_a_model_keyword(capsys):
    text = _help(capsys)
    sig = inspect.signature(Model)
    names = [f.name for _, f in settings.fields()]
    assert len(names) == len(set(names)) >= 28
    for name in names:
        assert settings.cli_flag(name) in text, name
        assert settings.env_name(name) in text, name
        assert sig.parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert f"``{name}``" in Model.__doc__


def test_env_vars_give_the_flags_defaults_and_flags_win(monkeypatch):
    monkeypatch.setenv("SUPERGGML_CTX_SIZE", "333")
    monkeypatch.setenv("SUPERGGML_PAGED_KV", "1")
    monkeypatch.setenv("SUPERGGML_DIRECT_IO", "off")
    monkeypatch.setenv("SUPERGGML_DEVICES", "CPU,CPU")
    monkeypatch.setenv("SUPERGGML_DEVICE_BUDGET", "64MiB")
    a = cli.build_parser().parse_args(["generate", "-p", "x", "--kv-page-size", "32", "--no-repack"])
    o = settings.options_from_args(a)
    assert (o["ctx_size"], o["paged_kv"], o["direct_io"], o["devices"]) == (333, True, False, ("CPU", "CPU"))
    assert (o["kv_page_size"], o["repack"], o["device_budget"]) == (32, False, "64MiB")
    a = cli.build_parser().parse_args(
        ["generate", "-p", "x", "-c", "12", "--no-paged-kv", "--direct-io", "auto", "--devices", "CPU"]
    )
    o = settings.options_from_args(a)
    assert (o["ctx_size"], o["paged_kv"], o["direct_io"], o["devices"]) == (12, False, None, ("CPU",))
    s = Settings.from_options(o)
    assert s.paging.device_budget == 64 << 20 and s.context.ctx_size == 12


def test_env_vars_give_the_server_flags_defaults(monkeypatch):
    monkeypatch.setenv("SUPERGGML_PORT", "9999")
    monkeypatch.setenv("SUPERGGML_ALIAS", "m")
    a = cli.build_parser().parse_args(["serve"])
    assert (a.port, a.alias, a.parallel) == (9999, "m", 4)
    assert cli.build_parser().parse_args(["serve", "--port", "1234"]).port == 1234


@pytest.mark.parametrize(
    "name, value", [("CTX_SIZE", "lots"), ("DIRECT_IO", "sometimes"), ("KV_TYPE", "q4"), ("PORT", "eighty")]
)
def test_a_bad_env_value_is_a_usage_error(monkeypatch, capsys, name, value):
    monkeypatch.setenv("SUPERGGML_" + name, value)
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "-p", "x"])
    assert e.value.code == 2 and f"SUPERGGML_{name}={value!r}" in capsys.readouterr().err


def test_a_new_option_needs_only_its_field(monkeypatch, capsys):
    """What adding `toy_option` to ContextSettings in settings.py gives, with no other edit."""
    toy = dataclasses.make_dataclass(
        "ContextSettings", [("toy_option", int, settings.option(7, "a toy"))], bases=(ContextSettings,), frozen=True
    )
    monkeypatch.setitem(settings.GROUPS, "context", toy)
    monkeypatch.setenv("SUPERGGML_TOY_OPTION", "9")
    text = _help(capsys)
    assert "--toy-option" in text and "SUPERGGML_TOY_OPTION" in text
    o = settings.options_from_args(cli.build_parser().parse_args(["generate", "-p", "x"]))
    assert o["toy_option"] == 9
    assert Settings.from_options(o).context.toy_option == 9
    assert Settings.from_options({"toy_option": 3}).as_options()["toy_option"] == 3


def test_strings_are_read_as_the_command_line_reads_them():
    s = Settings.from_options(
        dict(
            direct_io="on",
            flash_attn="off",
            n_threads="3",
            devices="CPU,CPU",
            cache_type_k="q8_0",
            device_budget="auto",
        )
    )
    assert (s.paging.direct_io, s.context.flash_attn, s.context.n_threads) == (True, False, 3)
    assert (s.devices.devices, s.context.cache_type_k, s.paging.device_budget) == (("CPU", "CPU"), "q8_0", "auto")
    for bad, match in [
        (dict(direct_io="maybe"), "direct_io='maybe'"),
        (dict(flash_attn="yes please"), "boolean"),
        (dict(n_threads="x"), "n_threads"),
        (dict(cache_type_v="q9"), "cache_type_v must be one of"),
    ]:
        with pytest.raises(ValueError, match=match):
            Settings.from_options(bad)


def test_aliases_unknown_names_and_normalisation():
    s = Settings.from_options({"n_ctx": 64, "n_batch": 512, "n_gpu_layers": -1, "host_budget": "1KiB"})
    assert (s.context.ctx_size, s.context.n_batch, s.paging.n_gpu_layers, s.kv.host_budget) == (64, 64, None, 1024)
    with pytest.raises(TypeError, match="same option"):
        Settings.from_options({"n_ctx": 64, "ctx_size": 64})
    with pytest.raises(TypeError, match="unexpected keyword argument 'ctx'"):
        Settings.from_options({"ctx": 64})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.context.ctx_size = 5  # type: ignore[misc]
    assert Settings().as_options() == {f.name: f.default for _, f in settings.fields()}


@pytest.mark.parametrize(
    "options, match",
    [
        ({"ctx_size": 0}, "ctx_size must be >= 1"),
        ({"n_batch": 0}, "n_batch must be >= 1"),
        ({"n_threads": 0}, "n_threads must be >= 1"),
        ({"kv_type": "q2_k"}, "kv_type must be one of"),
        ({"cache_type_v": "q8_0"}, "requires flash_attn"),
        ({"device_budget": "lots"}, "not a size"),
        ({"prefetch_depth": 0}, "prefetch_depth must be >= 1"),
        ({"mem_pressure": 0.0}, "mem_pressure must be in"),
        ({"kv_page_size": 8}, "kv_page_size must be in 16..8192"),
        ({"kv_device_layers": 0}, "kv_device_layers must be >= 1"),
        ({"metrics_interval": 0}, "metrics_interval must be >= 1"),
        ({"devices": ["CPU", "CPU"], "tensor_split": [1]}, "tensor_split needs 2"),
        ({"devices": ["CPU", "CPU"], "dynamic_layers": True}, "device_budget per device"),
        ({"devices": ["CPU", "CPU"], "device_budget": "1GiB,2GiB,3GiB"}, "3 sizes for 2 devices"),
        ({"rpc": ["localhost:1"], "rpc_timeout": 0}, "rpc_timeout must be > 0"),
        ({"rpc": ["localhost:1"], "dynamic_layers": True}, "device_budget per device"),  # CPU and a server: 2+
    ],
)
def test_each_check_names_its_option(options, match, smollm2_path):
    with pytest.raises(ValueError, match=match):
        Settings.from_options(options)
    with pytest.raises(ValueError, match=match):
        Model(smollm2_path, **options)  # before the file is even opened


def test_groups_derive_what_the_executor_needs():
    assert PagingSettings().stream_slots == 1
    assert PagingSettings(async_prefetch=True, prefetch_depth=3).stream_slots == 4
    assert not PagingSettings().paged(30) and PagingSettings(n_gpu_layers=3).paged(30)
    assert not PagingSettings(n_gpu_layers=99).paged(30)  # llama.cpp's "all of them"
    assert KVSettings(kv_spill_dir=".").kv_spill_dir == "."
    assert ContextSettings(n_threads=3).threads == 3 and ContextSettings().threads == settings.default_threads()


def test_kv_page_bounds_are_the_cores():
    """settings.py keeps native out: its page bounds are kv-cache.h's, as the core reports them."""
    from superggml import native

    assert (settings.KV_PAGE_MIN, settings.KV_PAGE_MAX) == (native.KV_PAGE_MIN, native.KV_PAGE_MAX)


def test_version(capsys):
    """`superggml --version`: the package's version and ggml's."""
    from superggml import __version__, native
    from superggml.commands import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"superggml {__version__} (ggml {native.GGML_VERSION})"


def test_default_threads_are_the_physical_cores_within_the_cpu_quota(tmp_path):
    """As llama.cpp counts them: one per core (hyperthreads share one), and no more than the cgroup's quota."""
    from superggml.settings import cpu_quota, default_threads, physical_cores

    (tmp_path / "cgroup").write_text("0::/job\n")
    (tmp_path / "job").mkdir()
    for text, want in (("max 100000\n", None), ("150000 100000\n", 2), ("50000 100000\n", 1)):
        (tmp_path / "job" / "cpu.max").write_text(text)
        assert cpu_quota(str(tmp_path / "cgroup"), str(tmp_path)) == want
    assert cpu_quota(str(tmp_path / "missing"), str(tmp_path)) is None
    assert physical_cores([0]) == 1 and physical_cores([10**6]) == 1  # an unreadable CPU counts once
    assert 1 <= default_threads() <= len(os.sched_getaffinity(0))


def test_poll_reaches_the_thread_pool(smollm2_path):
    from superggml import Model

    with Model(smollm2_path, ctx_size=64, poll=50) as m:
        assert m.runtime.backend.poll == 50
        m.eval([1, 2, 3])
    with pytest.raises(ValueError, match="poll"):
        Model(smollm2_path, poll=101)
