"""What a config alone builds, and the positions it allows (issue 52): RoBERTa's 514
positions hold 512 tokens (its ids start at pad_token_id + 1), and a config file or an
``advise`` of a config builds the class its ``architectures`` names, else the masked LM of an
encoder family (not its causal-LM head, which wants ``is_decoder``)."""

import json

import pytest
import torch

import fxshape

transformers = pytest.importorskip("transformers")


def test_roberta_default_seq_len_is_its_usable_positions():
    from fxshape.tracing.export import resolve_seq_len, position_offset

    cfg = transformers.RobertaConfig(max_position_embeddings=514, pad_token_id=1)
    assert position_offset(cfg) == 2  # pad_token_id 1 + 1
    assert resolve_seq_len(cfg, None) == 512  # min(1024, 514 - 2)
    assert resolve_seq_len(cfg, 512) == 512
    with pytest.raises(ValueError, match=r"exceeds the 512 positions the model can use.*"
                                         r"accepted: 1 to 512"):
        resolve_seq_len(cfg, 514)
    # a family without the offset keeps its whole table
    assert resolve_seq_len(transformers.BertConfig(max_position_embeddings=512), None) == 512
    with pytest.raises(ValueError, match="accepted: 1 to 512"):
        resolve_seq_len(transformers.BertConfig(max_position_embeddings=512), 513)


def test_config_alone_builds_the_class_it_names():
    from fxshape.tracing.configs import model_class_for

    cls, why = model_class_for(transformers.RobertaConfig())
    assert cls is transformers.RobertaForMaskedLM and "no architectures" in why
    cls, _ = model_class_for(transformers.RobertaConfig(is_decoder=True))
    assert cls is transformers.RobertaForCausalLM
    cls, why = model_class_for(
        transformers.BertConfig(architectures=["BertForSequenceClassification"]))
    assert cls is transformers.BertForSequenceClassification and "architectures" in why
    cls, _ = model_class_for(transformers.LlamaConfig())
    assert cls is transformers.LlamaForCausalLM


def test_config_file_and_advise_keep_the_class(tmp_path):
    from fxshape.codesign.advise import _build
    from fxshape.presets import load_target

    cfg = transformers.RobertaConfig(num_hidden_layers=1, hidden_size=64, intermediate_size=128,
                                     num_attention_heads=2, vocab_size=300,
                                     max_position_embeddings=130)
    d = cfg.to_dict()
    d.pop("architectures", None)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    model = load_target(str(path))
    assert type(model).__name__ == "RobertaForMaskedLM"
    report = fxshape.analyze(model)
    assert report.workload.seq_len == 128  # 130 positions less the 2 before the first id
    assert _build(None, cfg).__class__ is transformers.RobertaForMaskedLM
    with torch.device("meta"):
        given = transformers.RobertaForSequenceClassification(cfg)
    assert _build(type(given), cfg).__class__ is transformers.RobertaForSequenceClassification
