"""Where a `$ref` / `$dynamicRef` points in the document, as the specification resolves it.

Every subschema has a base URI: the nearest enclosing `$id` resolved against its parent's
(`id` in drafts 3-4; a root without one gets `ROOT_URI`). References resolve against the base
of the schema that writes them; a fragment is a JSON pointer into that resource or a plain
name (`$anchor`, `$dynamicAnchor`, or an `$id` / `id` of `#name` in older drafts) of it.
Resources outside the document are remote: an `UnsupportedSchemaError`, nothing is
downloaded. `$dynamicRef` is resolved per *dynamic scope* (the resources entered on the path
to it, outermost first), which the lowering carries as it walks: static per path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

from pegmask.grammars.errors import SchemaError, UnsupportedSchemaError

ROOT_URI = "pegmask-root:///schema.json"
"""Base URI of a document whose root has no `$id` (a scheme no reference can name by chance)."""


class Resources:
    """The document's schema resources, anchors and base URIs, indexed once."""

    def __init__(self, document: Any, subschemas: Callable[[dict[str, Any]], Iterable[tuple[str, Any]]],
                 *, legacy_ids: bool):
        self.document = document
        self.resources: dict[str, str] = {}  # URI (no fragment) -> pointer
        self.anchors: dict[tuple[str, str], str] = {}  # (resource URI, name) -> pointer
        self.dynamic: dict[tuple[str, str], str] = {}  # (resource URI, $dynamicAnchor) -> pointer
        self.base: dict[str, str] = {}  # pointer -> resource URI
        self._subschemas = subschemas
        self._legacy_ids = legacy_ids
        self._index(document, "", ROOT_URI)
        self.resources.setdefault(ROOT_URI, "")
        self.dynamic_resources = frozenset(uri for uri, _ in self.dynamic)

    def _index(self, schema: Any, pointer: str, base: str) -> None:
        if not isinstance(schema, dict):
            return
        ident = schema.get("$id")
        if not isinstance(ident, str) and self._legacy_ids:
            ident = schema.get("id")
        if isinstance(ident, str):
            if ident.startswith("#"):  # drafts 6-7 style plain-name anchor
                self.anchors.setdefault((base, ident[1:]), pointer)
            else:
                base = join(base, ident).partition("#")[0]
                self.resources.setdefault(base, pointer)
        self.base[pointer] = base
        for keyword, table in (("$anchor", self.anchors), ("$dynamicAnchor", self.dynamic)):
            if isinstance(schema.get(keyword), str):
                table.setdefault((base, schema[keyword]), pointer)
        for key, sub in self._subschemas(schema):
            self._index(sub, f"{pointer}/{key}", base)

    def base_of(self, pointer: str) -> str:
        """Base URI of the schema at `pointer` (or of its nearest indexed ancestor)."""
        while pointer not in self.base:
            pointer = pointer.rpartition("/")[0]
        return self.base[pointer]

    def resolve(self, ref: str, pointer: str) -> str:
        """The JSON pointer (in this document) that `ref`, written at `pointer`, names."""
        uri, _, fragment = join(self.base_of(pointer), ref).partition("#")
        if uri not in self.resources:
            raise UnsupportedSchemaError(
                "$ref", pointer, f"{ref!r} is a remote reference (not in this document; "
                "nothing is downloaded)")
        root = self.resources[uri]
        fragment = unquote(fragment)
        if fragment and not fragment.startswith("/"):
            found = self.anchors.get((uri, fragment), self.dynamic.get((uri, fragment)))
            if found is None:
                raise SchemaError(f"unresolvable $ref {ref!r}", pointer)
            return found
        target = root + fragment
        try:
            self.at_pointer(target)
        except (KeyError, IndexError, ValueError, TypeError):
            raise SchemaError(f"unresolvable $ref {ref!r}", pointer) from None
        return target

    def resolve_dynamic(self, ref: str, pointer: str, scope: tuple[str, ...]) -> str:
        """`$dynamicRef`: as `$ref`, unless it names a `$dynamicAnchor` that its target
        declares; then the outermost resource of `scope` declaring that anchor."""
        target = self.resolve(ref, pointer)
        name = join(self.base_of(pointer), ref).partition("#")[2]
        schema = self.at_pointer(target)
        if isinstance(schema, dict) and schema.get("$dynamicAnchor") == name:
            for uri in scope:
                if (uri, name) in self.dynamic:
                    return self.dynamic[(uri, name)]
        return target

    def entered(self, scope: tuple[str, ...], pointer: str) -> tuple[str, ...]:
        """The dynamic scope once the schema at `pointer` is entered: only the resources with
        dynamic anchors matter (so a document without any has one scope, `()`)."""
        uri = self.base_of(pointer)
        if uri in self.dynamic_resources and uri not in scope:
            return (*scope, uri)
        return scope

    def at_pointer(self, pointer: str) -> Any:
        node = self.document
        for token in pointer.split("/")[1:]:
            token = token.replace("~1", "/").replace("~0", "~")
            node = node[int(token)] if isinstance(node, list) else node[token]
        return node


def join(base: str, ref: str) -> str:
    """`ref` resolved against `base` (RFC 3986), also for schemes `urljoin` does not know
    (`urn:`, `tag:`): a fragment-only reference keeps the base's resource."""
    if ref.startswith("#"):
        return base.partition("#")[0] + ref
    if urlsplit(ref).scheme:
        return ref
    scheme = urlsplit(base).scheme
    if scheme in ("http", "https", "file", "ftp", ""):
        return urljoin(base, ref)
    # Hierarchical URIs of other schemes: resolve as http, then put the scheme back.
    return scheme + urljoin("http" + base[len(scheme):], ref)[len("http"):]
