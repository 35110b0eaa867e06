"""Mokka's YAML loader: PyYAML's safe loader, reading numbers the YAML 1.2 way.

A module of its own so that importing ``mokka.state.reader`` does not load
PyYAML: ``mokka ctl`` reads the overrides file Mokka writes as JSON
(``reader.load_json_or_yaml``) and a verb that meets no YAML never pays for
the library (``tests/test_startup_imports.py``).
"""

from __future__ import annotations

import re

import yaml

#: libyaml's parser when PyYAML was built with it (ten times faster), else pure Python.
BaseLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class Loader(BaseLoader):  # type: ignore[misc,valid-type]
    """``SafeLoader`` without YAML 1.1's base-60 numbers.

    Under YAML 1.1 an unquoted ``0000:53:00.0`` is the float 190980.0 and
    ``12:30`` the int 750.  Helm re-renders profiles without quoting bus ids
    (Go's YAML library has no base-60), so read numbers the YAML 1.2 way.
    """


_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
# Drop every inherited int/float resolver (they carry the base-60 forms), then
# add the rest of YAML 1.1's forms back: binary, leading-zero octal, decimal
# and hex ints; floats need a dot in the mantissa and a sign in the exponent
# (``2.06158430208e+11``), so ``1e5`` stays a string as under PyYAML's default.
Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in BaseLoader.yaml_implicit_resolvers.items()
}
Loader.add_implicit_resolver(_INT, re.compile(
    r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"))
Loader.add_implicit_resolver(_FLOAT, re.compile(
    r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))
