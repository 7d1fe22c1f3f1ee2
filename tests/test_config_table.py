"""The table that drives `parse_config` (`config.schema.SECTIONS`) against the rest of the schema:
every section and key of `DEFAULTS` has a rule, every rule a reader, every field a key."""

from __future__ import annotations

import dataclasses

from ddmd.config import Config
from ddmd.config.schema import DEFAULTS, SECTIONS, ValueOf
from ddmd.config.section import SectionReader


def test_every_section_of_the_defaults_is_read_and_none_else():
    assert set(SECTIONS) == set(DEFAULTS)
    assert set(SECTIONS) == {f.name for f in dataclasses.fields(Config)} - {"source"}


def test_every_key_has_a_rule_and_every_field_a_key():
    for name, schema in SECTIONS.items():
        assert set(schema.keys) == set(DEFAULTS[name]), name
        assert set(schema.keys) == {f.name for f in dataclasses.fields(schema.cls)}, name


def test_every_rule_names_a_reader_and_only_keys_read_before_it():
    for name, schema in SECTIONS.items():
        read: list[str] = []
        for key, rule in schema.keys.items():
            assert callable(getattr(SectionReader, rule.reader, None)), (name, key, rule.reader)
            for arg in rule.args:
                if isinstance(arg, ValueOf):
                    assert arg.key in read, (name, key, arg.key)
            read.append(key)


def test_security_is_read_before_the_hosts_that_follow_its_loopback_rule():
    assert next(iter(SECTIONS)) == "security"
