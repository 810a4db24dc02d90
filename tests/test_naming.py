"""Run names: the short axis names and the value spellings of run directories."""

from perencode.config.naming import format_value, short_key, short_names


def test_short_keys_drop_the_section_but_name_kinds_by_it():
    assert short_key("task.vocab_size") == "vocab_size"
    assert short_key("encoding.kind") == "encoding" and short_key("task.name") == "task"
    assert short_names(["task.length", "model.hidden_size"]) == {
        "task.length": "length", "model.hidden_size": "hidden_size"}
    # Colliding short names keep their dotted form, so directories stay unambiguous.
    assert short_names(["a.seed", "b.seed", "c.x"]) == {"a.seed": "a.seed", "b.seed": "b.seed",
                                                        "c.x": "x"}


def test_values_are_spelled_stably_and_never_as_paths():
    assert format_value(True) == "true" and format_value(False) == "false"
    assert format_value([0.9, 0.999]) == "0.9,0.999"
    assert format_value(1e-3) == "0.001" and format_value(256) == "256"
    assert format_value("a/b c") == "a-b_c"
