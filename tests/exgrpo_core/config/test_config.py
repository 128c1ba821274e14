"""Config tree: every preset loads and validates; bad keys and values give errors that name them."""

import pytest

from exgrpo_core.config.load import PRESETS_DIR, ConfigError, flatten, load_config
from exgrpo_core.config.schema import ExGRPOConfig


@pytest.mark.parametrize("preset", sorted(p.stem for p in PRESETS_DIR.glob("*.yaml")))
def test_every_preset_loads_and_validates(preset):
    cfg = load_config(preset)
    assert cfg.preset == preset
    assert cfg.train.batch_size % cfg.train.mini_batch_size == 0


def test_presets_exist():
    assert {"tiny", "cpu-demo", "paper"} <= {p.stem for p in PRESETS_DIR.glob("*.yaml")}


def test_paper_preset_matches_spec_recipe():
    cfg = load_config("paper")
    assert (cfg.rollout.group_size, cfg.train.batch_size, cfg.train.mini_batch_size) == (8, 128, 64)
    assert cfg.train.lr == 1e-6 and cfg.rollout.max_response_tokens == 8192
    assert cfg.buffer.replay_ratio == 0.5 and cfg.loss.shaping_beta == 0.1
    assert cfg.buffer.start_threshold == 0.35 and cfg.loss.entropy_coef == 0.001
    assert cfg.loss.kl_coef == 0.0 and cfg.eval.temperature == 0.6
    assert cfg.train.sharding == "fsdp2" and cfg.rollout.engine == "vllm"  # the memory plan's layout
    assert cfg.run.checkpoint_weights == "sharded"
    assert (cfg.rollout.vllm_tensor_parallel_size, cfg.rollout.vllm_gpu_memory_utilization) == (2, 0.35)


def test_defaults_follow_spec():
    cfg = ExGRPOConfig()
    assert cfg.collect_max_k == cfg.rollout.group_size - 1
    assert cfg.loss.aggregation == "seq_sum_norm" and cfg.loss.clip_mode == "until_replay"
    assert cfg.selection.trajectory == "argmin" and cfg.selection.question_weighting == "gaussian"
    assert cfg.replay_questions == 64
    assert cfg.buffer.zero_success == "keep_bucket"  # (code) no bucket update on 0 successes


def test_overrides_are_parsed_as_yaml_scalars():
    cfg = load_config("tiny", ["rollout.group_size=6", "train.lr=1e-4", "buffer.collect_max_k=null",
                               "run.name=x"])
    assert cfg.rollout.group_size == 6 and cfg.train.lr == 1e-4 and cfg.buffer.collect_max_k is None
    assert cfg.run.name == "x"


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match=r"rollout\.group_sizee: unknown key"):
        load_config("tiny", ["rollout.group_sizee=4"])


def test_bad_value_is_named():
    with pytest.raises(ConfigError, match=r"rollout\.temperature"):
        load_config("tiny", ["rollout.temperature=-1"])


def test_cross_field_rule_message():
    with pytest.raises(ConfigError, match=r"collect_min_k must be <= collect_max_k \(got 3 > 2\)"):
        load_config("tiny", ["buffer.collect_min_k=3", "buffer.collect_max_k=2"])


def test_malformed_override_and_missing_preset():
    with pytest.raises(ConfigError, match="dotted.key=value"):
        load_config("tiny", ["rollout.group_size"])
    with pytest.raises(ConfigError, match="not found"):
        load_config("no-such-preset")


def test_every_field_is_documented():
    def walk(model_cls, prefix=""):
        for name, field in model_cls.model_fields.items():
            ann = field.annotation
            yield f"{prefix}{name}", field.description
            if isinstance(ann, type) and issubclass(ann, ExGRPOConfig.__mro__[1]):
                yield from walk(ann, f"{prefix}{name}.")

    missing = [k for k, d in walk(ExGRPOConfig) if not d]
    assert not missing, f"fields without a docstring: {missing}"


def test_flatten_gives_dotted_params():
    flat = flatten(load_config("tiny"))
    assert flat["rollout.group_size"] == 8 and "loss.shaping_beta" in flat


def test_fsdp2_only_options_are_refused_without_fsdp2():
    with pytest.raises(ConfigError, match="train.cpu_offload needs train.sharding=fsdp2"):
        load_config("tiny", ["train.cpu_offload=true"])
    assert load_config("tiny", ["train.cpu_offload=true", "train.sharding=fsdp2"]).train.cpu_offload


def test_ambiguous_uniform_weighting_names_the_two_choices():
    with pytest.raises(ConfigError, match="question_uniform.*bucket_uniform"):
        load_config("tiny", ["selection.question_weighting=uniform"])
    assert load_config("tiny", ["selection.question_weighting=question_uniform"]).selection.question_weighting \
        == "question_uniform"


@pytest.mark.parametrize("raw", ["off", "yes", "2026", "1e3"])
def test_a_string_key_keeps_an_unquoted_word_or_number_as_written(raw):
    cfg = load_config("tiny", [f"run.name={raw}", "run.seed=7", "run.db_url=null"])
    assert cfg.run.name == raw and cfg.run.seed == 7 and cfg.run.db_url is None
    with pytest.raises(ConfigError, match="run.seed"):
        load_config("tiny", ["run.seed=off"])  # a typed key still refuses a word


def test_a_yaml_boolean_at_a_number_or_text_key_is_an_error_naming_it(tmp_path):
    preset = tmp_path / "mine.yaml"
    preset.write_text("run:\n  seed: off\n  name: no\ntrain:\n  hsdp: off\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(preset))
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == 2 and "run.seed: false" in lines[0] and "takes int" in lines[0]
    assert "run.name" in lines[1] and "quote it" in lines[1]  # train.hsdp takes on/off: no error
    assert load_config(str(preset), ["run.seed=1", "run.name=no"]).train.hsdp == "off"
