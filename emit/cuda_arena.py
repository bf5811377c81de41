"""A block's shared-memory arena: the CUDA target keeps the tiles of a statement in one array
of dynamic shared memory, each placed at the first gap that fits and free again once the
operation that reads it last has passed its barrier. The block's local buffers follow the
largest arena of any statement in the same array (emit.cuda_target)."""
from __future__ import annotations

SHARED_LIMIT = 227 * 1024  # the most a block may opt in to (sm_90); the runtime checks its own GPU


def declaration(size: int) -> str:
    """The arena `ft_arena` in CUDA: dynamic shared memory sized at launch, or, emulated (no
    launches to size it), a static array of `size` bytes. 64-byte aligned: the CUDA target
    places the regions of local buffers after the tiles at 64-byte multiples."""
    return f"""#ifdef FT_EMULATED
static __align__(64) unsigned char ft_arena[{size}];
#else
extern __shared__ __align__(64) unsigned char ft_arena[];
#endif"""


class Arena:
    """The places of one statement's tiles. Statements run one after another with a barrier
    between, so each allocates from offset 0."""

    def __init__(self):
        self.live: list = []  # (offset, bytes, owner)
        self.size = 0  # the most bytes in use at once: what a block needs

    def place(self, nbytes: int) -> int:
        """The offset alloc would give `nbytes`: the first gap that fits, 32-byte aligned."""
        size, start = -(-nbytes // 32) * 32, 0
        for off, n, _ in sorted(self.live, key=lambda t: t[0]):
            if off - start >= size:
                break
            start = max(start, off + n)
        return start

    def alloc(self, nbytes: int, owner) -> str:
        """A place (32-byte aligned, as WMMA wants) at the first gap that fits: its C address."""
        size, start = -(-nbytes // 32) * 32, self.place(nbytes)
        self.live.append((start, size, owner))
        self.size = max(self.size, start + size)
        return f"(ft_arena + {start})"

    def free(self, dead) -> None:
        """Free the places whose owner `dead(owner)` says is read no more."""
        self.live = [t for t in self.live if not dead(t[2])]
