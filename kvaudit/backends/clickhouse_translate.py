"""kvaudit SQL (DuckDB's dialect) to ClickHouse, through sqlglot.

The named queries and the audit rules are written once, in DuckDB SQL. sqlglot
translates most of it; this module adds what kvaudit's queries need beyond that:

- `getvariable('name')`, how the queries take parameters in DuckDB, becomes the
  parameter's value as a literal (ClickHouse has no session variables);
- `json_object(...)` becomes JSON text built with `toJSONString` (ClickHouse has no
  json_object; a nested json_object, or a CASE of them, is embedded as is);
- `concat_ws` skips NULL arguments, as in DuckDB (sqlglot's translation would turn
  them into empty strings between separators);
- `list_sort(x)` becomes `arraySort(x)` and `array_to_string(x, sep)` becomes
  `arrayStringConcat(x, sep)` (sqlglot's spellings are not ClickHouse's);
- `list_product(x)` becomes `arrayProduct(x)`, which also reads the views' nullable
  arrays (ClickHouse's `arrayJoin`, sqlglot's `unnest`, does not);
- the aggregate `product(x)` becomes `arrayProduct(groupArray(x))` (ClickHouse has no
  product aggregate);
- continuous percentiles (`percentile_cont(q) WITHIN GROUP (ORDER BY x)`,
  `quantile_cont(x, q)`, `median(x)`) become `quantileExactInclusive(q)(x)`: the same
  linear interpolation between the two nearest values (sqlglot's `quantile` samples);
- `to_timestamp(seconds)` keeps its fraction of a second and its time zone (sqlglot's
  translation truncates to whole seconds);
- `make_timestamp_ns(nanoseconds)` becomes `fromUnixTimestamp64Nano(.., 'UTC')` (sqlglot
  passes it through, and ClickHouse has no such function);
- `md5_number_upper(x)` and `md5_number_lower(x)`, the halves of the MD5 digest as
  UBIGINT, are read the same way out of ClickHouse's `MD5(x)`: a hash both engines
  compute alike, where DuckDB's `hash` has no equal in ClickHouse;
- `WITH x AS [NOT] MATERIALIZED (...)` loses its `[NOT] MATERIALIZED`: ClickHouse inlines
  CTEs, and older servers know neither keyword (the results are the same either way);
- `cume_dist()` is spelled in lower case, the only spelling ClickHouse knows;
- `recent(ts, span)`, kvaudit SQL's own function (a macro on DuckDB), is written out
  as its definition (`base.RECENT`);
- a selected `t.column` is named `column`, as in DuckDB (ClickHouse would name it `t.column`);
- `key_id(key)`, kvaudit SQL's own function (the key itself on DuckDB), becomes the key's
  128-bit hash (`clickhouse_views.KEY_ID`): read from the view `pages_keyed`, stored at
  insert in the typed tables, where the key is a column of `pages` in its SELECT (that
  source then reads `pages_keyed`), and computed otherwise;
- `count(DISTINCT key)` over `pages` counts the key ids other than 0 (a NULL key's):
  the same count (`uniqExact` keeps that very hash of each string it counts), without
  hashing every key as it is read.

Where a construct has no translation, the source query is written in a form both
engines share instead (see queries/README.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Final, NamedTuple

import sqlglot
from sqlglot import exp

from kvaudit.backends.base import RECENT, Params
from kvaudit.backends.clickhouse_views import KEY_ID, KEYED_VIEW, key_id_sql

READ: Final = "duckdb"
WRITE: Final = "clickhouse"


class Statement(NamedTuple):
    sql: str
    returns_rows: bool  # a query (SELECT, UNION, ...), not a statement such as CREATE


def to_clickhouse(
    sql: str, params: Params | None = None, columns: Mapping[str, Sequence[str]] | None = None
) -> list[Statement]:
    """The ClickHouse statements for the kvaudit SQL `sql` with its variables bound.

    Args:
        sql: kvaudit SQL.
        params: the values of its `getvariable` variables.
        columns: the columns of tables and views, by name: `t.*` over one of them (or
            over a CTE or subquery of them) is expanded, because ClickHouse names the
            columns of a `t.*` that also occur in another joined table `t.column`, and
            DuckDB names them `column`.

    Raises:
        sqlglot.errors.ParseError: `sql` is not valid DuckDB SQL.
    """
    bound = tuple(sorted((params or {}).items()))
    known = tuple(sorted((name, tuple(names)) for name, names in (columns or {}).items()))
    return list(_translate(sql, bound, known))


@lru_cache(maxsize=256)
def _translate(
    sql: str, params: tuple[tuple[str, object], ...], columns: tuple[tuple[str, tuple[str, ...]], ...]
) -> tuple[Statement, ...]:
    values, known = dict(params), dict(columns)
    statements = []
    for tree in sqlglot.parse(sql, read=READ):
        if tree is None:
            continue
        _expand_stars(tree, known)
        _use_key_ids(tree)
        for rewrite in (_bind_variables(values), _rewrite_functions, _rewrite_json_objects):
            tree = tree.transform(rewrite)
        statements.append(Statement(tree.sql(dialect=WRITE), isinstance(tree, exp.Query)))
    return tuple(statements)


def _bind_variables(values: dict[str, object]) -> Callable[[exp.Expression], exp.Expression]:
    def bind(node: exp.Expression) -> exp.Expression:
        if _is_call(node, "getvariable"):
            name = node.expressions[0].name
            value = values.get(name)
            return exp.null() if value is None else exp.convert(value)
        return node

    return bind


def _expand_stars(tree: exp.Expression, known: dict[str, tuple[str, ...]]) -> None:
    """Expand `t.*` in place wherever t's columns can be told: a known table or view, or a
    CTE or subquery built on them (innermost first, so each is known before its users)."""
    names = dict(known)

    def visit(node: exp.Expression) -> None:
        # A WITH first (sqlglot keeps it last on a UNION): its CTEs precede their users.
        children = sorted(node.iter_expressions(), key=lambda child: child.arg_key != "with_")
        for child in children:
            visit(child)
        if isinstance(node, exp.Select):
            _expand_select(node, names)
        if isinstance(node, exp.Query) and isinstance(node.parent, exp.CTE | exp.Subquery) and node.parent.alias:
            output = _output_names(node, names)
            if output is not None:
                names[node.parent.alias] = output

    visit(tree)


def _sources(select: exp.Select, names: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """The columns of each source of a SELECT (by its alias) whose columns are known."""
    found = {}
    for join in [select.args.get("from_"), *(select.args.get("joins") or [])]:
        source = join.this if join is not None else None
        if isinstance(source, exp.Table) and source.name in names:
            found[source.alias_or_name] = names[source.name]
        elif isinstance(source, exp.Subquery) and source.alias in names:
            found[source.alias] = names[source.alias]
    return found


def _expand_select(select: exp.Select, names: dict[str, tuple[str, ...]]) -> None:
    sources = _sources(select, names)
    projections: list[exp.Expression] = []
    for selected in select.expressions:
        if isinstance(selected, exp.Column) and isinstance(selected.this, exp.Star) and selected.table in sources:
            table = selected.table
            projections += [exp.alias_(exp.column(name, table), name) for name in sources[table]]
        else:
            projections.append(selected)
    if len(projections) != len(select.expressions):
        select.set("expressions", projections)


def _output_names(query: exp.Query, names: dict[str, tuple[str, ...]]) -> tuple[str, ...] | None:
    """The column names a query outputs, or None where a star hides them."""
    if isinstance(query, exp.SetOperation):
        return _output_names(query.left, names)
    if not isinstance(query, exp.Select):
        return None
    sources = _sources(query, names)
    output: list[str] = []
    for selected in query.expressions:
        if isinstance(selected, exp.Star) and len(sources) == 1 and not query.args.get("joins"):
            output += next(iter(sources.values()))
        elif selected.is_star:
            return None
        else:
            output.append(selected.alias_or_name)
    return tuple(output)


def _use_key_ids(tree: exp.Expression) -> None:
    """`key_id(key)` and `count(DISTINCT key)` of `pages` read the key ids (module docstring)."""
    # A CTE of the query's own named `pages` is not the view.
    shadowed = any(cte.alias == "pages" for cte in tree.find_all(exp.CTE))
    for count in list(tree.find_all(exp.Count)):
        distinct = count.this
        # Only a plain aggregate: sqlglot writes FILTER and OVER of a function it knows alone.
        plain = not isinstance(count.parent, exp.Filter | exp.Window)
        if shadowed or not plain or not isinstance(distinct, exp.Distinct) or len(distinct.expressions) != 1:
            continue
        [column] = distinct.expressions
        table = _pages_key(column)
        if table is not None:
            key_id = _keyed(table, column)
            # A NULL key's id is 0; testing the id spares reading the keys' NULL map.
            present = exp.NEQ(this=key_id.copy(), expression=exp.Literal.number(0))
            count.replace(exp.Anonymous(this="uniqExactIf", expressions=[key_id, present]))
    for call in list(tree.find_all(exp.Anonymous)):
        if _is_call(call, "key_id") and len(call.expressions) == 1:
            [key] = call.expressions
            table = None if shadowed else _pages_key(key)
            call.replace(_keyed(table, key) if table is not None else _key_id(key))


def _pages_key(column: exp.Expression) -> exp.Table | None:
    """The `pages` source of its SELECT that `column` is the key of, or None."""
    select = column.find_ancestor(exp.Select)
    if not isinstance(column, exp.Column) or column.name != "key" or select is None:
        return None
    if any(selected.is_star for selected in select.expressions):
        return None  # its source will read `pages_keyed`, whose star has one more column
    joins = [select.args.get("from_"), *(select.args.get("joins") or [])]
    sources = [join.this for join in joins if join is not None]
    if column.table:
        sources = [source for source in sources if source.alias_or_name == column.table]
    if len(sources) != 1 or not isinstance(sources[0], exp.Table) or sources[0].db:
        return None
    return sources[0] if sources[0].name in ("pages", KEYED_VIEW) else None


def _keyed(table: exp.Table, key: exp.Column) -> exp.Column:
    """The key id column of `key`, its `pages` source `table` made to read `pages_keyed` (same alias)."""
    if table.name == "pages":
        if not table.alias:
            table.set("alias", exp.TableAlias(this=exp.to_identifier("pages")))
        table.set("this", exp.to_identifier(KEYED_VIEW))
    return exp.column(KEY_ID, table=key.table or None)


def _key_id(key: exp.Expression) -> exp.Expression:
    """The key id of `key`, computed."""
    return (
        _key_id_definition()
        .copy()
        .transform(lambda n: key.copy() if isinstance(n, exp.Column) and n.name == "key" else n)
    )


def _rewrite_functions(node: exp.Expression) -> exp.Expression:
    if isinstance(node, exp.CTE) and node.args.get("materialized") is not None:
        node.set("materialized", None)
    if isinstance(node, exp.Select):
        for i, selected in enumerate(node.expressions):
            if isinstance(selected, exp.Column) and selected.table and not isinstance(selected.this, exp.Star):
                node.expressions[i] = exp.alias_(selected, selected.name)
    if isinstance(node, exp.ConcatWs):
        separator, *parts = node.expressions
        strings = [exp.cast(part, exp.DataType.build("Nullable(String)", dialect=WRITE)) for part in parts]
        # arrayStringConcat leaves NULL elements out, as DuckDB's concat_ws does.
        return exp.Anonymous(this="arrayStringConcat", expressions=[exp.Array(expressions=strings), separator])
    percentile = _percentile(node)
    if percentile is not None:
        return percentile
    if isinstance(node, exp.UnixToTime) and node.args.get("scale") is None:
        micros = exp.cast(exp.func("round", exp.Mul(this=node.this, expression=exp.Literal.number("1e6"))), "Int64")
        return exp.Anonymous(this="fromUnixTimestamp64Micro", expressions=[micros, exp.Literal.string("UTC")])
    if _is_call(node, "make_timestamp_ns") and len(node.expressions) == 1:
        nanos = exp.cast(node.expressions[0], "Int64")
        return exp.Anonymous(this="fromUnixTimestamp64Nano", expressions=[nanos, exp.Literal.string("UTC")])
    if isinstance(node, exp.CumeDist):
        return exp.Anonymous(this="cume_dist")
    for name, start in (("md5_number_upper", 1), ("md5_number_lower", 9)):
        if _is_call(node, name):
            digest = exp.Anonymous(this="MD5", expressions=node.expressions)  # the binary digest, not hex
            half = exp.func("substring", digest, start, 8)
            return exp.Anonymous(this="reinterpretAsUInt64", expressions=[half])
    if _is_call(node, "recent") and len(node.expressions) == 2:
        ts, span = node.expressions
        arguments = {"ts": ts, "span": span}
        definition = _recent().copy()
        return exp.Paren(
            this=definition.transform(
                lambda n: arguments[n.name].copy() if isinstance(n, exp.Column) and n.name in arguments else n
            )
        )
    if isinstance(node, exp.ArraySort) and not node.args.get("expression"):
        return exp.Anonymous(this="arraySort", expressions=[node.this])
    if isinstance(node, exp.ArrayToString):
        # The replacement's arguments are not visited again: rewrite them here.
        array = node.this.transform(_rewrite_functions)
        return exp.Anonymous(this="arrayStringConcat", expressions=[array, node.expression])
    if _is_call(node, "list_product"):
        return exp.Anonymous(this="arrayProduct", expressions=node.expressions)
    if _is_call(node, "product"):
        grouped = exp.Anonymous(this="groupArray", expressions=node.expressions)
        product = exp.Anonymous(this="arrayProduct", expressions=[grouped])
        # Over no non-NULL value DuckDB's product is NULL; arrayProduct of [] is not.
        no_values = exp.EQ(this=exp.Count(this=node.expressions[0].copy()), expression=exp.Literal.number(0))
        return exp.If(this=no_values, true=exp.null(), false=product)
    return node


def _percentile(node: exp.Expression) -> exp.Expression | None:
    """`quantileExactInclusive(q)(x)` for a continuous percentile of x, or None for anything else."""
    if isinstance(node, exp.WithinGroup) and isinstance(node.this, exp.PercentileCont):
        [ordered] = node.expression.expressions
        level = node.this.this
        if ordered.args.get("desc"):
            level = exp.Sub(this=exp.Literal.number(1), expression=level)
        value = ordered.this
    elif isinstance(node, exp.PercentileCont):
        value, level = node.this, node.expression
    elif isinstance(node, exp.Median):
        value, level = node.this, exp.Literal.number(0.5)
    else:
        return None
    return exp.ParameterizedAgg(this="quantileExactInclusive", expressions=[level], params=[value])


def _rewrite_json_objects(node: exp.Expression) -> exp.Expression:
    # `transform` does not descend into a replaced node, so nested objects are built here.
    return _json_text(node) if isinstance(node, exp.JSONObject) else node


def _json_text(node: exp.JSONObject) -> exp.Expression:
    parts: list[exp.Expression] = []
    for i, pair in enumerate(node.expressions):
        prefix = ("," if i else "{") + json.dumps(pair.this.name) + ":"
        parts += [exp.Literal.string(prefix), _json_value(pair.expression)]
    parts.append(exp.Literal.string("}" if parts else "{}"))
    return exp.Anonymous(this="concat", expressions=parts)


def _json_value(value: exp.Expression) -> exp.Expression:
    """A value as JSON text; NULL as `null`, like DuckDB's json_object."""
    if isinstance(value, exp.JSONObject):
        return _json_text(value)
    if isinstance(value, exp.Case) and _json_branches(value):
        for branch in value.args.get("ifs") or []:
            if isinstance(branch.args["true"], exp.JSONObject):
                branch.set("true", _json_text(branch.args["true"]))
        if isinstance(value.args.get("default"), exp.JSONObject):
            value.set("default", _json_text(value.args["default"]))
        return exp.func("ifNull", value, exp.Literal.string("null"))
    return exp.func("ifNull", exp.Anonymous(this="toJSONString", expressions=[value]), exp.Literal.string("null"))


def _json_branches(case: exp.Case) -> bool:
    """Whether every result of a CASE is a json_object (or NULL): its text is embedded as is."""
    results = [branch.args["true"] for branch in case.args.get("ifs") or []]
    if case.args.get("default") is not None:
        results.append(case.args["default"])
    return bool(results) and all(isinstance(r, exp.JSONObject | exp.Null) for r in results)


def _is_call(node: exp.Expression, name: str) -> bool:
    return isinstance(node, exp.Anonymous) and node.name.lower() == name


@lru_cache(maxsize=1)
def _key_id_definition() -> exp.Expression:
    return sqlglot.parse_one(key_id_sql("key"), read=WRITE)


@lru_cache(maxsize=1)
def _recent() -> exp.Expression:
    return sqlglot.parse_one(RECENT, read=READ)
