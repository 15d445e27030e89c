"""Tree ensembles from model files, checked in Python before XGBoost's or LightGBM's native code
reads them.

Both libraries trust a saved model: XGBoost reads a truncated buffer past its end, and both follow
a child index or a feature index out of range into other memory at prediction time.  A damaged
file would crash the process, a crafted one could do worse; model files are shared, so they are
data to check.  Here each file is parsed strictly, its trees must be proper binary trees over the
features this tensortune computes, and the library then reads only what was checked: XGBoost a
JSON text written from the parsed model, LightGBM the header and the trees (what comes after the
trees, importances and training parameters, is not needed to predict and is dropped).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from tensortune.errors import TensortuneError, shown

# Deeper trees than any setting of ours grows, shallow enough for the libraries' recursive walks.
MAX_DEPTH = 4096
# XGBoost stores the root's parent as an invalid node id (-1 with its "left child" bit cleared).
_XGB_NO_PARENT = (-1, 2**31 - 1)


class _Damaged(Exception):
    """What is wrong with a model's trees; the public functions say so as a ``TensortuneError``."""


@contextmanager
def _refusing() -> Iterator[None]:
    try:
        yield
    except _Damaged as e:
        raise TensortuneError(f"its trees are damaged or foreign: {e}") from None


# ---- XGBoost -----------------------------------------------------------------------------------


def xgboost_booster(state: bytes, width: int):
    """An XGBoost ``Booster`` from the UBJSON bytes ``save_raw("ubj")`` wrote, after checking
    that every tree is a proper tree over ``width`` features."""
    import xgboost as xgb

    with _refusing():
        model = _UBJSON(state).document()
        _check_xgboost(model, width)
    booster = xgb.Booster()
    try:
        # XGBoost reads the JSON form when the text starts with '{"' (as json.dumps writes it).
        booster.load_model(bytearray(json.dumps(model).encode()))
    except xgb.core.XGBoostError as e:
        raise TensortuneError(f"XGBoost cannot read it: {_library_failure(e)}") from None
    return booster


def _check_xgboost(model: object, width: int) -> None:
    """Refuse unless ``model`` (XGBoost's JSON model, parsed) is a tree ensemble on ``width``
    features that XGBoost can predict with without reading outside its arrays."""
    learner = _field(model, "learner", dict)
    param = _field(learner, "learner_model_param", dict)
    features = _int_text(param, "num_feature")
    if features != width:
        raise _Damaged(f"it reads {features} features per row, this tensortune computes {width}")
    if _int_text(param, "num_target") != 1 or _int_text(param, "num_class") != 0:
        raise _Damaged("it predicts more than one value per row")
    base = param.get("base_score")  # added to every prediction: "[5E-1]" (XGBoost 3), "5E-1"
    try:
        finite = math.isfinite(float(str(base).strip("[]")))
    except ValueError:
        finite = False
    if not finite:
        raise _Damaged(f"base_score {shown(base)} is not a finite number")
    # What turns the trees' sum into a prediction (a logistic or multi-class objective would
    # transform it, or raise in XGBoost at predict time): tensortune's trees are all trained
    # for squared error, custom objectives included.
    objective = _field(learner, "objective", dict).get("name")
    if objective != "reg:squarederror":
        raise _Damaged(f"objective {shown(objective)}, not reg:squarederror")
    booster = _field(learner, "gradient_booster", dict)
    if booster.get("name") != "gbtree":
        raise _Damaged(f"booster {shown(booster.get('name'))}, not gbtree")
    body = _field(booster, "model", dict)
    trees = _field(body, "trees", list)
    counts = _field(body, "gbtree_model_param", dict)
    if _int_text(counts, "num_trees") != len(trees) or _int_text(counts, "num_parallel_tree") != 1:
        raise _Damaged("its tree count does not match its trees")
    info = _ints(body, "tree_info", len(trees))
    if any(info):
        raise _Damaged("a tree of another output than the first")
    bounds = body.get("iteration_indptr", [0, len(trees)])
    if not (
        isinstance(bounds, list)
        and all(type(b) is int for b in bounds)
        and bounds[:1] == [0]
        and bounds[-1] == len(trees)
        and bounds == sorted(bounds)
    ):
        raise _Damaged("its iterations do not cover its trees")
    if learner.get("feature_names", []) != [] or learner.get("feature_types", []) != []:
        raise _Damaged("named or typed features (tensortune's models have neither)")
    cats = body.get("cats", {})
    if not isinstance(cats, dict) or any(v != [] for v in cats.values()):
        raise _Damaged("categorical features (tensortune's models have none)")
    for k, tree in enumerate(trees):
        try:
            # XGBoost files a tree under its own id: two trees of one id leave another slot
            # empty, and a prediction then reads through a null pointer (a crash, not an error).
            if not isinstance(tree, dict) or tree.get("id") != k:
                raise _Damaged("the trees are not numbered in order")
            _check_xgboost_tree(tree, width)
        except _Damaged as e:
            raise _Damaged(f"tree {k}: {e}") from None


def _check_xgboost_tree(tree: object, width: int) -> None:
    param = _field(tree, "tree_param", dict)
    n = _int_text(param, "num_nodes")
    if n < 1 or _int_text(param, "num_feature") != width:
        raise _Damaged("its size or feature count is wrong")
    if _int_text(param, "size_leaf_vector") not in (0, 1):
        raise _Damaged("vector leaves (tensortune's models predict one value)")
    left, right = _ints(tree, "left_children", n), _ints(tree, "right_children", n)
    parents, split = _ints(tree, "parents", n), _ints(tree, "split_indices", n)
    categorical = ("categories", "categories_nodes", "categories_segments", "categories_sizes")
    if any(_ints(tree, "split_type", n)) or any(tree.get(f, []) != [] for f in categorical):
        raise _Damaged("categorical splits (tensortune's models have none)")
    if any(d not in (0, 1) for d in _ints(tree, "default_left", n)):
        raise _Damaged("default_left holds a value other than 0 and 1")
    for name in ("split_conditions", "base_weights", "loss_changes", "sum_hessian"):
        _numbers(tree, name, n)
    # What a prediction adds up (a leaf's value is its split condition) and compares with.
    if not all(math.isfinite(v) for k in ("split_conditions", "base_weights") for v in tree[k]):
        raise _Damaged("a split or leaf value that is not a finite number")
    if parents[0] not in _XGB_NO_PARENT:
        raise _Damaged("the root has a parent")
    reached = _walk(0, n, lambda i: (left[i], right[i]) if left[i] != -1 or right[i] != -1
                    else None, lambda i, c: 0 <= c < n and parents[c] == i,
                    lambda i: 0 <= split[i] < width)  # fmt: skip
    # Pruned nodes stay in the arrays, unreachable; XGBoost only needs them to be leaves.
    if any(not reached[i] and (left[i] != -1 or right[i] != -1) for i in range(n)):
        raise _Damaged("a node outside the tree has children")


def _walk(root: int, n: int, children, child_ok, split_ok) -> list[bool]:
    """Which of ``n`` nodes a walk from ``root`` reaches, refusing a node reached twice (a
    cycle, a shared subtree), a child that ``child_ok`` refuses, a split on a feature that
    ``split_ok`` refuses, and a walk deeper than ``MAX_DEPTH``."""
    reached = [False] * n
    reached[root] = True
    level, depth = [root], 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            raise _Damaged(f"deeper than {MAX_DEPTH} levels")
        below = []
        for i in level:
            pair = children(i)
            if pair is None:
                continue
            if not split_ok(i):
                raise _Damaged(f"node {i} splits on a feature out of range")
            for c in pair:
                if not child_ok(i, c) or reached[c]:
                    raise _Damaged(f"node {i} has a child that is out of range or not its own")
                reached[c] = True
                below.append(c)
        level = below
    return reached


_UBJ_NUMBERS = {b"i": ">i1", b"U": ">u1", b"I": ">i2", b"l": ">i4", b"L": ">i8",
                b"d": ">f4", b"D": ">f8"}  # fmt: skip
_UBJ_INTEGERS = (b"i", b"U", b"I", b"l", b"L")
_UBJ_NESTING = 32  # XGBoost's model nests six deep


class _UBJSON:
    """A strict reader of the UBJSON subset that XGBoost writes: every length is checked against
    the bytes left, every marker known, nothing may follow the document."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def document(self) -> dict:
        if self._peek() != b"{":
            raise _Damaged("not an XGBoost model (UBJSON object expected)")
        self.pos += 1
        out = self._container(b"{", 1)
        if self.pos != len(self.data):
            raise _Damaged(f"{len(self.data) - self.pos} bytes after the model")
        return out

    def _peek(self) -> bytes:
        return self.data[self.pos : self.pos + 1]

    def _take(self, n: int) -> bytes:
        if n > len(self.data) - self.pos:
            raise _Damaged("the model ends early (truncated file?)")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def _number(self, marker: bytes) -> int | float:
        dtype = np.dtype(_UBJ_NUMBERS[marker])
        return np.frombuffer(self._take(dtype.itemsize), dtype)[0].item()

    def _length(self) -> int:
        marker = self._take(1)
        if marker not in _UBJ_INTEGERS:
            raise _Damaged(f"a length of type {marker!r}")
        n = int(self._number(marker))
        if n < 0:
            raise _Damaged("a negative length")
        return n

    def _text(self) -> str:
        try:
            return self._take(self._length()).decode()
        except UnicodeDecodeError:
            raise _Damaged("a string that is not UTF-8") from None

    def _value(self, marker: bytes, depth: int) -> object:
        if marker in _UBJ_NUMBERS:
            return self._number(marker)
        if marker == b"S":
            return self._text()
        if marker in (b"T", b"F", b"Z"):
            return {b"T": True, b"F": False, b"Z": None}[marker]
        if marker in (b"[", b"{"):
            if depth >= _UBJ_NESTING:
                raise _Damaged("nested too deep")
            return self._container(marker, depth + 1)
        raise _Damaged(f"unknown UBJSON marker {marker!r} at byte {self.pos - 1}")

    def _container(self, kind: bytes, depth: int) -> object:
        typed = count = None
        if self._peek() == b"$":
            self.pos += 1
            typed = self._take(1)
            if kind != b"[" or typed not in _UBJ_NUMBERS or self._peek() != b"#":
                raise _Damaged("a typed container other than an array of numbers with a count")
        if self._peek() == b"#":
            self.pos += 1
            count = self._length()
        if typed is not None:
            dtype = np.dtype(_UBJ_NUMBERS[typed])
            assert count is not None
            if count > (len(self.data) - self.pos) // dtype.itemsize:
                raise _Damaged("the model ends early (truncated file?)")
            return np.frombuffer(self._take(count * dtype.itemsize), dtype).tolist()
        end = b"]" if kind == b"[" else b"}"
        items: list = []
        fields: dict = {}
        while True:
            done = len(items) + len(fields)
            if count is None and self._peek() == end:
                self.pos += 1
                break
            if count is not None and done == count:
                break
            if kind == b"[":
                items.append(self._value(self._take(1), depth))
                continue
            key = self._text()
            if key in fields:
                raise _Damaged(f"field {shown(key)} twice")
            fields[key] = self._value(self._take(1), depth)
        return items if kind == b"[" else fields


# ---- LightGBM ----------------------------------------------------------------------------------

_LGBM_HEADER = {"version", "num_class", "num_tree_per_iteration", "label_index",
                "max_feature_idx", "objective", "feature_names", "feature_infos",
                "tree_sizes"}  # fmt: skip
# Each field of a tree: how many values it holds (one, one per internal node, one per leaf), and
# whether they are integers.
_LGBM_COUNTS = {
    "num_leaves": ("scalar", True), "num_cat": ("scalar", True), "is_linear": ("scalar", True),
    "shrinkage": ("scalar", False), "split_feature": ("internal", True),
    "split_gain": ("internal", False), "threshold": ("internal", False),
    "decision_type": ("internal", True), "left_child": ("internal", True),
    "right_child": ("internal", True), "internal_value": ("internal", False),
    "internal_weight": ("internal", False), "internal_count": ("internal", True),
    "leaf_value": ("leaf", False), "leaf_weight": ("leaf", False), "leaf_count": ("leaf", True),
}  # fmt: skip
# What LightGBM's parser requires of every tree (it aborts the process without them).
_LGBM_REQUIRED = {"num_leaves", "num_cat", "leaf_value"}
_INT = re.compile(r"-?[0-9]+")
# Numbers as LightGBM writes them ("%.17g"); LightGBM's fast parser reads n of them blindly.
_NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?(?:inf|nan)")
_LGBM_CATEGORICAL, _LGBM_MISSING_TYPES = 1, 3  # decision_type: bit 0, and bits 2-3 (0, 1 or 2)


def lightgbm_booster(state: bytes, width: int):
    """A LightGBM ``Booster`` from the model text ``model_to_string`` wrote, after checking
    that every tree is a proper tree over ``width`` features."""
    import lightgbm as lgb

    with _refusing():
        text = _checked_lightgbm(state, width)
    try:
        return lgb.Booster(model_str=text)
    except lgb.basic.LightGBMError as e:
        raise TensortuneError(f"LightGBM cannot read it: {_library_failure(e)}") from None


def _checked_lightgbm(state: bytes, width: int) -> str:
    """The header and trees of LightGBM model text, once they are checked: what LightGBM's
    parser (which follows offsets and indices without bounds) may read."""
    # LightGBM's parser splits lines at \r too and stops at a NUL: neither may hide anything.
    if re.search(rb"[^\x20-\x7e\n]", state):
        raise _Damaged("characters that LightGBM's model text never holds")
    text = state.decode("ascii")
    first = text.find("\nTree=")
    end = text.find("\nend of trees\n")
    if not text.startswith("tree\n") or first < 0 or end < first:
        raise _Damaged("not LightGBM model text with trees")
    header = _lgbm_header(text[: first + 1], width)
    starts = [m.start() for m in re.finditer(r"^Tree=", text[: end + 1], re.MULTILINE)]
    bounds = [*starts, end + 1]
    sizes = [b - a for a, b in itertools.pairwise(bounds)]
    if "tree_sizes" in header and header["tree_sizes"] != " ".join(map(str, sizes)):
        # LightGBM parses the trees at these offsets, whatever is there.
        raise _Damaged("tree_sizes does not match the trees")
    for k, (a, b) in enumerate(itertools.pairwise(bounds)):
        try:
            _check_lightgbm_tree(text[a:b], k, width)
        except _Damaged as e:
            raise _Damaged(f"tree {k}: {e}") from None
    return text[: end + 1] + "end of trees\n"


def _lgbm_header(text: str, width: int) -> dict[str, str]:
    lines = text.split("\n")[1:]
    fields = {}
    for line in (ln for ln in lines if ln):
        key, sep, value = line.partition("=")
        if not sep or key not in _LGBM_HEADER or key in fields:
            raise _Damaged(f"header line {shown(line)}")
        fields[key] = value
    if fields.get("objective", "custom") != "custom":
        raise _Damaged(f"objective {shown(fields['objective'])} (tensortune's is its own)")
    for key in ("num_class", "num_tree_per_iteration"):
        if fields.get(key) != "1":
            raise _Damaged(f"{key} is not 1")
    if fields.get("max_feature_idx") != str(width - 1):
        raise _Damaged(f"max_feature_idx is {shown(fields.get('max_feature_idx'))}, not "
                       f"{width - 1}: this tensortune computes {width} features")  # fmt: skip
    for key in ("feature_names", "feature_infos"):
        if len(fields.get(key, "").split(" ")) != width:
            raise _Damaged(f"{key} does not name {width} features")
    return fields


def _check_lightgbm_tree(block: str, k: int, width: int) -> None:
    head, _, body = block.partition("\n")
    lines, _, rest = body.partition("\n\n")
    if head != f"Tree={k}" or rest.strip("\n"):
        raise _Damaged("its text is not one tree")
    fields: dict[str, list[str]] = {}
    for line in lines.split("\n"):
        key, sep, value = line.partition("=")
        if not sep or key not in _LGBM_COUNTS or key in fields:
            raise _Damaged(f"line {shown(line)}")
        fields[key] = value.split(" ") if value else []
    _require(fields, _LGBM_REQUIRED)
    leaves = int(fields["num_leaves"][0]) if _INT.fullmatch(" ".join(fields["num_leaves"])) else 0
    if leaves < 1:
        raise _Damaged("num_leaves is not a positive integer")
    # LightGBM reads each field's numbers one after another, without a count, and aborts the
    # process (from inside a parallel loop) at a token it cannot parse: all must be right.  Of
    # a tree of one leaf it reads the scalars and the leaf's value only (the other fields are
    # written empty then, leaf_weight included).
    count = {"scalar": 1, "internal": leaves - 1, "leaf": leaves}
    read = [k for k in fields if leaves > 1 or _LGBM_COUNTS[k][0] == "scalar" or k == "leaf_value"]
    for key in read:
        tokens, (where, integers) = fields[key], _LGBM_COUNTS[key]
        form = _INT if integers else _NUMBER
        if len(tokens) != count[where] or not all(form.fullmatch(t) for t in tokens):
            what = "integers" if integers else "numbers"
            raise _Damaged(f"{key} does not hold {count[where]} {what}")
    if not all(math.isfinite(float(t)) for k in ("leaf_value", "threshold", "shrinkage")
               if k in read for t in fields[k]):  # fmt: skip
        raise _Damaged("a split or leaf value that is not a finite number")
    if fields["num_cat"] != ["0"] or fields.get("is_linear", ["0"]) != ["0"]:
        raise _Damaged("categorical or linear (tensortune's models have neither)")
    if leaves == 1:
        return
    _require(fields, {"split_feature", "threshold", "left_child", "right_child"})
    split, left, right = ([int(t) for t in fields[key]]
                          for key in ("split_feature", "left_child", "right_child"))  # fmt: skip
    decisions = [int(t) for t in fields.get("decision_type", [])]
    if any(d & _LGBM_CATEGORICAL or (d >> 2) & _LGBM_MISSING_TYPES == 3 or not 0 <= d < 16
           for d in decisions):  # fmt: skip
        raise _Damaged("a decision type other than a numerical split")
    # Internal nodes are 0 .. leaves-2, a leaf j is written as ~j; one walk sees both.
    n = 2 * leaves - 1
    reached = _walk(0, n, lambda i: (_node(left[i], leaves), _node(right[i], leaves))
                    if i < leaves - 1 else None, lambda i, c: 0 <= c < n,
                    lambda i: 0 <= split[i] < width)  # fmt: skip
    if not all(reached):
        raise _Damaged("a node or leaf outside the tree")


def _require(fields: dict, keys: set[str]) -> None:
    missing = keys - fields.keys()
    if missing:
        raise _Damaged(f"it lacks {', '.join(sorted(missing))}")


def _node(child: int, leaves: int) -> int:
    """A LightGBM child as an index among internal nodes then leaves (-1 when out of range)."""
    if child >= 0:
        return child if child < leaves - 1 else -1
    return leaves - 1 + ~child if ~child < leaves else -1


# ---- shared ------------------------------------------------------------------------------------


def _library_failure(e: Exception) -> str:
    """The first line of a library's error without its time and source location: XGBoost's
    carries a list of candidates and a native backtrace after it."""
    lines = str(e).strip().splitlines() or [type(e).__name__]
    return re.sub(r"^\[[0-9:]+\] \S+:[0-9]+: ", "", lines[0])[:200]


def _field(container: object, key: str, kind: type):
    if not isinstance(container, dict) or not isinstance(container.get(key), kind):
        raise _Damaged(f"{key} is missing or not a {kind.__name__}")
    return container[key]


def _int_text(container: dict, key: str) -> int:
    """XGBoost's model parameters are decimal text."""
    value = container.get(key)
    if not isinstance(value, str) or not _INT.fullmatch(value):
        raise _Damaged(f"{key} is missing or not an integer")
    return int(value)


def _ints(container: dict, key: str, n: int) -> list[int]:
    values = container.get(key)
    if not isinstance(values, list) or len(values) != n or not all(type(v) is int for v in values):
        raise _Damaged(f"{key} does not hold {n} integers")
    return values


def _numbers(container: dict, key: str, n: int) -> None:
    values = container.get(key)
    if (
        not isinstance(values, list)
        or len(values) != n
        or not all(type(v) in (int, float) for v in values)
    ):
        raise _Damaged(f"{key} does not hold {n} numbers")
