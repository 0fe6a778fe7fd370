from typing import TypeVar

_T = TypeVar("_T")

class TrieNode:
    key: int
    depth: int
    parent: int | None
    children: int | set[int] | None
    holders: set[int]
    generation: int
    def __init__(self, key: int, depth: int, parent: int | None, generation: int) -> None: ...

def untrack(obj: _T) -> _T: ...
