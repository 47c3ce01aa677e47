"""commscope's own collectives, built from point-to-point sends and receives on one group.

Each function works on contiguous tensors, in group ranks (0 .. n-1), through a :class:`Peers`: the peers
of a torch.distributed group (:class:`GroupPeers`, what a user calls them with) or of a raw gloo backend
that no torch group knows about (:class:`BackendPeers`, what the mixed runtime runs them on). Each step of
an algorithm posts all its sends and receives at once and waits for them, so every rank is in the same step
with its peers; a zero-length piece is neither sent nor received (both ends know its length).

The algorithms and their costs for n ranks and S bytes, in the alpha-beta model of [thakur-2005]
(alpha: latency per message, beta: seconds per byte, gamma: seconds per byte reduced):

    op              name                 messages (per rank)   bytes sent per rank     notes
    all_reduce      ring                 2(n-1)                2(n-1)/n S              reduce-scatter then all-gather
    all_reduce      recursive_doubling   log2 n (+2)           S log2 n                any n: the extra ranks fold in first
    all_gather      ring                 n-1                   (n-1)/n S
    all_gather      recursive_doubling   log2 n                (n-1)/n S               n a power of two
    reduce_scatter  ring                 n-1                   (n-1)/n S
    reduce_scatter  recursive_halving    log2 n                (n-1)/n S               n a power of two
    all_to_all      pairwise             n-1                   (n-1)/n S               uneven splits too
    all_to_all      bruck                log2 n                S/2 log2 n              even splits; fewer, larger messages
    broadcast       binomial             <= log2 n             <= S log2 n             root sends log2 n times

Worked number: all_reduce of S = 64 MiB over n = 4 by ring sends 2*3/4*64 = 96 MiB per rank in 6 messages;
recursive doubling sends 64*2 = 128 MiB in 2: recursive doubling wins where alpha dominates (small S),
ring where beta does (large S). The tuning suite measures where the crossover lies on a real machine.

Every rank ends with the same bits: a reduced piece is computed once and copied (ring, halving), or by both
partners of a pair as ``a op b`` and ``b op a``, which IEEE arithmetic makes equal (recursive doubling).
The reduction order differs from gloo's or NCCL's, so float sums agree with theirs to rounding, not bits;
integer and exactly representable data agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

__all__ = [
    "ALGORITHMS",
    "REDUCE_OPS",
    "Algorithm",
    "BackendPeers",
    "GroupPeers",
    "Peers",
    "all_gather_recursive_doubling",
    "all_gather_ring",
    "all_reduce_recursive_doubling",
    "all_reduce_ring",
    "all_to_all_bruck",
    "all_to_all_pairwise",
    "broadcast_binomial",
    "reduce_op_name",
    "reduce_scatter_recursive_halving",
    "reduce_scatter_ring",
]

Sends = Sequence[tuple[torch.Tensor, int]]


class Peers(Protocol):
    """The ranks of one group as seen from one of them."""

    @property
    def rank(self) -> int:
        """This process's rank in the group."""

    @property
    def size(self) -> int:
        """n: ranks in the group."""

    def exchange(self, sends: Sends, recvs: Sends) -> None:
        """Send each ``(tensor, peer)`` of ``sends``, receive into each of ``recvs``; return when all are done."""


@dataclass(frozen=True, slots=True)
class GroupPeers:
    """The peers of a torch.distributed group (None: the default group), through ``batch_isend_irecv``."""

    group: Any = None

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    @property
    def size(self) -> int:
        return dist.get_world_size(self.group)

    def exchange(self, sends: Sends, recvs: Sends) -> None:
        ops = [dist.P2POp(dist.isend, t, group=self.group, group_peer=p) for t, p in sends if t.numel()]
        ops += [dist.P2POp(dist.irecv, t, group=self.group, group_peer=p) for t, p in recvs if t.numel()]
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()


@dataclass(frozen=True, slots=True)
class BackendPeers:
    """The peers of a raw c10d backend (a ``ProcessGroupGloo`` no torch group holds), through its send/recv.

    For backends without coalescing (gloo): each send and receive is its own Work, all posted before any
    is waited on. Messages between two ranks are matched in the order they were posted (one tag).
    """

    backend: Any

    @property
    def rank(self) -> int:
        return self.backend.rank()

    @property
    def size(self) -> int:
        return self.backend.size()

    def exchange(self, sends: Sends, recvs: Sends) -> None:
        works = [self.backend.send([t], p, 0) for t, p in sends if t.numel()]
        works += [self.backend.recv([t], p, 0) for t, p in recvs if t.numel()]
        for work in works:
            work.wait()


# ----- reductions -----

def _minimum(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.minimum(a, b, out=a)


def _maximum(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.maximum(a, b, out=a)


#: Reductions the algorithms implement (``a op= b``, commutative), by torch.distributed's name.
_COMBINE: dict[Any, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    dist.ReduceOp.SUM: torch.Tensor.add_,
    dist.ReduceOp.PRODUCT: torch.Tensor.mul_,
    dist.ReduceOp.MIN: _minimum,
    dist.ReduceOp.MAX: _maximum,
}
#: Names of the reductions the algorithms support (others, e.g. AVG or PREMUL_SUM, stay with the native backend).
REDUCE_OPS: tuple[str, ...] = ("sum", "prod", "min", "max")
_NAMES = dict(zip(_COMBINE, REDUCE_OPS))


def reduce_op_name(op: Any) -> str | None:
    """``sum``, ``prod``, ``min`` or ``max`` for a ``ReduceOp`` (or its ``RedOpType``); None for any other."""
    return _NAMES.get(getattr(op, "op", op))


def _combine(op: Any) -> Callable[[torch.Tensor, torch.Tensor], Any]:
    fn = _COMBINE.get(getattr(op, "op", op))
    if fn is None:
        raise ValueError(f"reduce op {op!r}: commscope's algorithms support {', '.join(REDUCE_OPS)}")
    return fn


# ----- helpers -----

def _flat(t: torch.Tensor, what: str) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError(f"{what} must be contiguous (got strides {tuple(t.stride())})")
    return t.view(-1)


def _offsets(numel: int, n: int) -> list[int]:
    """Boundaries of n pieces of ``numel`` elements, sizes differing by at most one (the first ones larger)."""
    base, extra = divmod(numel, n)
    out = [0]
    for i in range(n):
        out.append(out[-1] + base + (1 if i < extra else 0))
    return out


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _blocks(flat: torch.Tensor, n: int) -> list[torch.Tensor]:
    """n equal blocks of a flat tensor (views)."""
    c = flat.numel() // n
    return [flat[i * c:(i + 1) * c] for i in range(n)]


# ----- all_reduce -----

def all_reduce_ring(tensor: torch.Tensor, peers: Peers, op: Any = dist.ReduceOp.SUM) -> None:
    """In place: ring reduce-scatter (rank r ends owning piece r+1), then ring all-gather of the pieces."""
    combine = _combine(op)
    flat = _flat(tensor, "tensor")
    n, r = peers.size, peers.rank
    if n == 1 or flat.numel() == 0:
        return
    bounds = _offsets(flat.numel(), n)

    def piece(i: int) -> torch.Tensor:
        i %= n
        return flat[bounds[i]:bounds[i + 1]]

    right, left = (r + 1) % n, (r - 1) % n
    scratch = torch.empty(bounds[1] - bounds[0], dtype=flat.dtype, device=flat.device)
    for k in range(n - 1):  # reduce-scatter: piece r-k goes right, piece r-k-1 comes from the left
        into = piece(r - k - 1)
        tmp = scratch[:into.numel()]
        peers.exchange([(piece(r - k), right)], [(tmp, left)])
        combine(into, tmp)
    for k in range(n - 1):  # all-gather: rank r owns piece r+1 and passes on what it last received
        peers.exchange([(piece(r + 1 - k), right)], [(piece(r - k), left)])


def all_reduce_recursive_doubling(tensor: torch.Tensor, peers: Peers, op: Any = dist.ReduceOp.SUM) -> None:
    """In place: log2 p rounds of exchanging whole vectors with rank r xor 2^k, p the largest power of two <= n.

    For n not a power of two, the first 2(n-p) ranks pair up first: each even one hands its vector to the
    odd one after it and sits out, and gets the result back at the end (MPICH's scheme, [thakur-2005]).
    """
    combine = _combine(op)
    flat = _flat(tensor, "tensor")
    n, r = peers.size, peers.rank
    if n == 1 or flat.numel() == 0:
        return
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    tmp = torch.empty_like(flat)
    if r < 2 * rem:
        if r % 2 == 0:
            peers.exchange([(flat, r + 1)], [])
            peers.exchange([], [(flat, r + 1)])
            return
        peers.exchange([], [(tmp, r - 1)])
        combine(flat, tmp)
        new = r // 2
    else:
        new = r - rem

    def real(v: int) -> int:
        return 2 * v + 1 if v < rem else v + rem

    d = 1
    while d < p:
        partner = real(new ^ d)
        peers.exchange([(flat, partner)], [(tmp, partner)])
        combine(flat, tmp)
        d <<= 1
    if r < 2 * rem:
        peers.exchange([(flat, r - 1)], [])


# ----- all_gather -----

def _check_gather(output: torch.Tensor, input: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    out, inp = _flat(output, "output"), _flat(input, "input")
    if out.numel() != n * inp.numel():
        raise ValueError(f"output has {out.numel()} elements; expected {n} x {inp.numel()} (n x input)")
    return out, inp


def all_gather_ring(output: torch.Tensor, input: torch.Tensor, peers: Peers) -> None:
    """``output`` = the n ranks' ``input`` blocks in rank order; block r-k travels right at step k."""
    n, r = peers.size, peers.rank
    out, inp = _check_gather(output, input, n)
    blocks = _blocks(out, n)
    blocks[r].copy_(inp)
    right, left = (r + 1) % n, (r - 1) % n
    for k in range(n - 1):
        peers.exchange([(blocks[(r - k) % n], right)], [(blocks[(r - k - 1) % n], left)])


def all_gather_recursive_doubling(output: torch.Tensor, input: torch.Tensor, peers: Peers) -> None:
    """``output`` as :func:`all_gather_ring`; at distance d, ranks swap their aligned windows of d blocks (n = 2^k)."""
    n, r = peers.size, peers.rank
    if not _is_power_of_two(n):
        raise ValueError(f"recursive doubling all_gather needs a power-of-two group, got {n} ranks")
    out, inp = _check_gather(output, input, n)
    c = inp.numel()
    out[r * c:(r + 1) * c].copy_(inp)
    d = 1
    while d < n:
        partner = r ^ d
        mine, theirs = (r // d) * d * c, (partner // d) * d * c
        peers.exchange([(out[mine:mine + d * c], partner)], [(out[theirs:theirs + d * c], partner)])
        d <<= 1


# ----- reduce_scatter -----

def reduce_scatter_ring(output: torch.Tensor, input: torch.Tensor, peers: Peers, op: Any = dist.ReduceOp.SUM) -> None:
    """``output`` = block r of the reduction of every rank's ``input`` (n blocks); partial block r-k-1 travels right."""
    combine = _combine(op)
    n, r = peers.size, peers.rank
    acc, out = _check_gather(input, output, n)
    acc = acc.clone()
    blocks = _blocks(acc, n)
    tmp = torch.empty_like(out)
    right, left = (r + 1) % n, (r - 1) % n
    for k in range(n - 1):
        peers.exchange([(blocks[(r - k - 1) % n], right)], [(tmp, left)])
        combine(blocks[(r - k - 2) % n], tmp)
    out.copy_(blocks[r])


def reduce_scatter_recursive_halving(output: torch.Tensor, input: torch.Tensor, peers: Peers,
                                     op: Any = dist.ReduceOp.SUM) -> None:
    """``output`` as :func:`reduce_scatter_ring`; each round halves the window of blocks a rank reduces (n = 2^k)."""
    combine = _combine(op)
    n, r = peers.size, peers.rank
    if not _is_power_of_two(n):
        raise ValueError(f"recursive halving reduce_scatter needs a power-of-two group, got {n} ranks")
    acc, out = _check_gather(input, output, n)
    acc = acc.clone()
    c = out.numel()
    tmp = torch.empty(n // 2 * c, dtype=acc.dtype, device=acc.device)
    lo, d = 0, n // 2
    while d >= 1:
        partner = r ^ d
        keep = lo + d if r & d else lo  # first block of the half that holds block r
        give = lo if r & d else lo + d
        recv = tmp[:d * c]
        peers.exchange([(acc[give * c:(give + d) * c], partner)], [(recv, partner)])
        combine(acc[keep * c:(keep + d) * c], recv)
        lo, d = keep, d // 2
    out.copy_(acc[r * c:(r + 1) * c])


# ----- all_to_all -----

def _split_offsets(splits: Sequence[int] | None, total_rows: int, n: int, row: int, what: str) -> list[int]:
    if not splits:
        if total_rows % n:
            raise ValueError(f"{what}: {total_rows} rows do not split evenly over {n} ranks; give split sizes")
        splits = [total_rows // n] * n
    if len(splits) != n or sum(splits) != total_rows or min(splits) < 0:
        raise ValueError(f"{what} split sizes {list(splits)}: expected {n} non-negative sizes summing to {total_rows}")
    out = [0]
    for s in splits:
        out.append(out[-1] + s * row)
    return out


def _rows(t: torch.Tensor) -> tuple[int, int]:
    """(rows along dim 0, elements per row) as all_to_all_single splits them."""
    if t.dim() == 0:
        return 1, 1
    rows = t.shape[0]
    return rows, (t.numel() // rows if rows else 0)


def all_to_all_pairwise(output: torch.Tensor, input: torch.Tensor, peers: Peers,
                        output_split_sizes: Sequence[int] | None = None,
                        input_split_sizes: Sequence[int] | None = None) -> None:
    """``all_to_all_single``: at step k, rank r sends its block for r+k and receives the block from r-k.

    Split sizes count rows along dim 0, as torch.distributed's; None splits the rows evenly.
    """
    n, r = peers.size, peers.rank
    out, inp = _flat(output, "output"), _flat(input, "input")
    out_rows, out_row = _rows(output)
    in_rows, in_row = _rows(input)
    so = _split_offsets(output_split_sizes, out_rows, n, out_row, "output")
    si = _split_offsets(input_split_sizes, in_rows, n, in_row, "input")
    out[so[r]:so[r + 1]].copy_(inp[si[r]:si[r + 1]])
    for k in range(1, n):
        dst, src = (r + k) % n, (r - k) % n
        peers.exchange([(inp[si[dst]:si[dst + 1]], dst)], [(out[so[src]:so[src + 1]], src)])


def all_to_all_bruck(output: torch.Tensor, input: torch.Tensor, peers: Peers) -> None:
    """Even ``all_to_all_single`` in ceil(log2 n) rounds (Bruck et al. 1997, as in [thakur-2005]).

    Rotate so that block i is the one for rank r+i; in the round of bit d, send every block whose index has
    bit d set to rank r+d (packed into one message) and take the same blocks from r-d; block i then holds
    the data rank r-i sent to r.
    """
    n, r = peers.size, peers.rank
    out, inp = _flat(output, "output"), _flat(input, "input")
    if out.numel() != inp.numel() or inp.numel() % n:
        raise ValueError(f"bruck all_to_all needs equal input and output of a multiple of {n} elements, got "
                         f"{inp.numel()} and {out.numel()}")
    c = inp.numel() // n
    work = torch.cat([inp[r * c:], inp[:r * c]])  # block i: for rank r+i
    blocks = _blocks(work, n)
    d = 1
    while d < n:
        moving = [i for i in range(n) if i & d]
        send = torch.cat([blocks[i] for i in moving])
        recv = torch.empty_like(send)
        peers.exchange([(send, (r + d) % n)], [(recv, (r - d) % n)])
        for j, i in enumerate(moving):
            blocks[i].copy_(recv[j * c:(j + 1) * c])
        d <<= 1
    for i in range(n):
        src = (r - i) % n
        out[src * c:(src + 1) * c].copy_(blocks[i])


# ----- broadcast -----

def broadcast_binomial(tensor: torch.Tensor, peers: Peers, root: int = 0) -> None:
    """In place from group rank ``root``: a binomial tree, each rank receives once and then sends to r+2^k."""
    flat = _flat(tensor, "tensor")
    n, r = peers.size, peers.rank
    if not 0 <= root < n:
        raise ValueError(f"root {root} is not a rank of this {n}-rank group")
    v = (r - root) % n  # rank relative to the root
    mask = 1
    while mask < n:
        if v & mask:
            peers.exchange([], [(flat, (r - mask) % n)])
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if v + mask < n:
            peers.exchange([(flat, (r + mask) % n)], [])
        mask >>= 1


# ----- registry -----

@dataclass(frozen=True, slots=True, kw_only=True)
class Algorithm:
    """One of commscope's collective algorithms, as the tuning suite and the mixed runtime see it."""

    op: str
    """The collective it implements (torch.distributed's name with an underscore: ``all_reduce``...)."""
    name: str
    """Its name in tuning tables (``ring``, ``recursive_doubling``...)."""
    run: Callable[..., None]
    """The function; its arguments are the op's (see the module's functions)."""
    power_of_two_only: bool = False
    """Needs a group of 2^k ranks."""
    uneven_splits: bool = False
    """all_to_all only: takes split sizes."""

    def applies_to(self, group_size: int) -> bool:
        """Whether it runs on a group of ``group_size`` ranks."""
        return group_size >= 1 and (not self.power_of_two_only or _is_power_of_two(group_size))


def _registry(*algorithms: Algorithm) -> dict[str, dict[str, Algorithm]]:
    table: dict[str, dict[str, Algorithm]] = {}
    for a in algorithms:
        table.setdefault(a.op, {})[a.name] = a
    return table


#: op -> algorithm name -> :class:`Algorithm`.
ALGORITHMS: dict[str, dict[str, Algorithm]] = _registry(
    Algorithm(op="all_reduce", name="ring", run=all_reduce_ring),
    Algorithm(op="all_reduce", name="recursive_doubling", run=all_reduce_recursive_doubling),
    Algorithm(op="all_gather", name="ring", run=all_gather_ring),
    Algorithm(op="all_gather", name="recursive_doubling", run=all_gather_recursive_doubling, power_of_two_only=True),
    Algorithm(op="reduce_scatter", name="ring", run=reduce_scatter_ring),
    Algorithm(op="reduce_scatter", name="recursive_halving", run=reduce_scatter_recursive_halving,
              power_of_two_only=True),
    Algorithm(op="all_to_all", name="pairwise", run=all_to_all_pairwise, uneven_splits=True),
    Algorithm(op="all_to_all", name="bruck", run=all_to_all_bruck),
    Algorithm(op="broadcast", name="binomial", run=broadcast_binomial),
)
