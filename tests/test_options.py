"""The attention options and the configuration names, each declared once: run's flags and serve's settings come
from options.OPTIONS, and every configuration name goes through names.NamedConfig."""

from __future__ import annotations

import pytest


def test_run_flags_and_serve_settings_are_derived_from_one_declaration():
    pytest.importorskip("llama_cpp.server")
    from llama_extrapolate import cli, server
    from llama_extrapolate.options import OPTIONS

    run = next(a for a in cli.build_parser()._subparsers._group_actions[0].choices["run"]._actions
               if a.dest == "memory_selection")
    assert run.choices == list(OPTIONS["memory_selection"].choices)
    fields = server.ExtrapolateModelSettings.model_fields
    for name, spec in OPTIONS.items():
        assert fields[name].default == spec.default, name
        assert cli.build_parser().parse_args(["run", "--file", "F"]).__dict__[name] == spec.default, name
    with pytest.raises(ValueError, match="greater than or equal to 32"):
        server.ExtrapolateModelSettings(memory_block_size=16)


def test_options_name_a_bad_value_and_a_missing_companion():
    from llama_extrapolate.options import AttentionOptions

    with pytest.raises(ValueError, match="--memory-selection 'row': choose one of head, layer"):
        AttentionOptions(memory_selection="row")
    with pytest.raises(ValueError, match="--top-k '5': give a whole number"):
        AttentionOptions(top_k="5")


@pytest.mark.parametrize("name", ["lambda", "vanilla", "lambda+top-k", "profile=/x/p.json",
                                  "lambda+memory:m=16:c=0", "lambda+memory:m=64:c=1024:passages:layer",
                                  "lambda+memory:m=64:c=1024:q4_0:passages:hold",
                                  "lambda+memory:m=64:c=256:last=32:q8_0:principal:passages:layer:hold",
                                  "lambda+memory:m=64:c=128:last=32:q4_0:lm=16:hold"])
def test_canonical_names_read_back_as_themselves(name):
    from llama_extrapolate.names import NamedConfig

    assert NamedConfig.parse(name).name == name


def test_labels_of_stored_names():
    from llama_extrapolate.names import NamedConfig

    assert NamedConfig.parse("lambda+memory:m=16", stored=True).label() == "Λ + memory (m = 16, bound only, B = 64, k = 5)"
    assert NamedConfig.parse("lambda+memory:m=64:c=1024:passages:layer").label() == (
        "Λ + memory (m = 64, 1024 candidates, per layer, B = 64, whole blocks in text order)")
    assert NamedConfig.parse("lambda+memory:m=64:c=1024:q4_0:hold").label() == (
        "Λ + memory (m = 64, 1024 candidates, B = 64, k = 5, q4_0 store, answer holds the question's blocks)")
    assert NamedConfig.parse("lambda+memory:q4_0").name.endswith(":q4_0")
    assert NamedConfig.parse("profile=/x/p.json").label() == "profile=p.json"
    with pytest.raises(ValueError, match="the store's type, principal and lm need lambda\\+memory"):
        NamedConfig("lambda", memory_type="q4_0")
    assert NamedConfig.parse("lambda+memory:m=64:c=128:q4_0:lm=16:hold").label() == (
        "Λ + memory (m = 64, 128 candidates, landmarks of 16, B = 64, k = 5, q4_0 store, answer holds the question's "
        "blocks)")
    with pytest.raises(ValueError, match="lm must be a whole number >= 1"):
        NamedConfig.parse("lambda+memory:m=64:lm=0")
    assert NamedConfig.parse("lambda+memory:m=64:c=256:q8_0:principal:hold").label() == (
        "Λ + memory (m = 64, 256 candidates, principal axes, B = 64, k = 5, q8_0 store, answer holds the question's "
        "blocks)")
    with pytest.raises(ValueError, match="store type 'q5_1': use one of q8_0, q4_0, f16, f32"):
        NamedConfig("lambda+memory", memory_blocks=64, memory_candidates=0, memory_type="q5_1")
    with pytest.raises(ValueError, match="spell a memory as lambda\\+memory"):
        NamedConfig.parse("lambda+memory:x")


def test_the_memorys_store_is_q8_0_where_it_is_small_and_q4_0_where_disk_asks_for_it(default_model):
    """q4_0 lost SmolLM2's needle at 32k (1 of 5 depths, q8_0 4 of 5): the default store is q8_0 where a token's
    keys and values take at most 64 KiB in it (SmolLM2: 30 layers x 3 KV heads x 64 values x 2 x 34/32 bytes), q4_0
    beyond (Llama-2-7B's 32 x 32 x 128: 272 KiB a token, 34 GiB at 128k tokens), f16 for heads q4_0/q8_0 cannot
    take (not a multiple of 32 values)."""
    from dataclasses import replace

    import llama_extrapolate as le
    from llama_extrapolate.options import memory_store_bytes_per_token, memory_type_for

    info = le.read_model_info(str(default_model))
    assert memory_store_bytes_per_token(info, "q8_0") == 30 * 3 * 64 * 2 * 34 // 32
    assert memory_store_bytes_per_token(info, "q4_0") == 30 * 3 * 64 * 2 * 18 // 32
    assert memory_type_for(info) == "q8_0"
    assert memory_type_for(info, "q4_0") == "q4_0"  # asked for
    wide = replace(info, block_count=32, head_count_kv=32, key_length=128)
    assert memory_store_bytes_per_token(wide, "q8_0") == 272 * 1024 and memory_type_for(wide) == "q4_0"
    per_layer = replace(info, head_count_kv=[3] * 30)  # a list of each layer's KV heads counts alike
    assert memory_store_bytes_per_token(per_layer, "q8_0") == memory_store_bytes_per_token(info, "q8_0")
    assert memory_type_for(replace(info, key_length=80)) == "f16"


def test_run_and_serve_select_by_landmarks_alone_unless_told(default_model):
    """The default first stage is the landmarks of 16 keys, which select the m blocks themselves (reranking 2m of
    them won no answer the grids asked, and cost the 7B shape's question a third more time); asked for the bound
    (--memory-landmark 0, or principal axes, which are the bound's), the bound's 16m candidates are reranked, since
    the bound alone loses needles; candidates given are kept either way."""
    import llama_extrapolate as le
    from llama_extrapolate.config import MEMORY_CANDIDATES_PER_BLOCK
    from llama_extrapolate.options import DEFAULT_MEMORY_LANDMARK, LANDMARK_CANDIDATES_PER_BLOCK, AttentionOptions

    info = le.read_model_info(str(default_model))

    def chosen(**given):
        options, _ = AttentionOptions(**given).resolve_on(info)
        resolved = options.attention(info).resolve(info)
        return options.memory_landmark_or_default(), resolved.memory_blocks, resolved.memory_candidates

    assert LANDMARK_CANDIDATES_PER_BLOCK == 0
    assert chosen() == (DEFAULT_MEMORY_LANDMARK, 64, 0) == (16, 64, 0)
    assert chosen(memory_landmark=0) == (0, 64, MEMORY_CANDIDATES_PER_BLOCK * 64)
    assert chosen(memory_axes="principal") == (0, 64, MEMORY_CANDIDATES_PER_BLOCK * 64)
    assert chosen(memory_landmark=8, memory_candidates=300) == (8, 64, 300)
    assert chosen(memory_blocks=16) == (16, 16, 0)
    assert chosen(memory_landmark=16, memory_candidates=128) == (16, 64, 128)  # the previous default, when told
