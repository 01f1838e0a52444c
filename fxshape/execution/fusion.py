"""Fusion groups as torch.compile's Inductor forms them: which memory-bound ops run as one
generated kernel (``execution="compiled"``).

The model of Inductor's scheduler, on the captured graph:

- **Library calls stay whole.** GEMMs and attention (cuBLAS, FlashAttention) are extern
  kernels. So are scatters (``index_put``, ``embedding_dense_backward``: atomic-add
  kernels whose output is not fused into consumers) and ops Inductor falls back to (sort,
  topk). Each keeps its eager kernels.
- **Pointwise ops and reductions fuse** (ops without a kernel pass through). A consumer
  joins its producer's group when:
  - they iterate over the same domain. A pointwise op's domain is its output; a
    reduction's is the tensor it reduces. So a pointwise prologue joins a reduction, and a
    normalisation epilogue joins the reduction that produced its statistics;
  - or the consumer works on the reduction's output domain (the ``rsqrt(var + eps)`` of
    the rows).
- **A pointwise value read once is inlined** into its reader's kernel, whatever the
  domains (a causal mask built by ``ones`` and ``triu`` is computed inside the softmax that
  reads it); one read several times is written once and read by each.
- **Siblings fuse.** Two fusible ops that read the same tensor over the same domain share
  a kernel (Inductor's horizontal fusion).
- **One reduction loop nest per kernel.** Reductions fuse only with reductions of the same
  shape (rows, row length): a LayerNorm and the sum of a whole tensor (a loss) are two
  kernels.
- **Column reductions.** A reduction over the tokens (a bias's gradient, a norm's weight
  gradient) loops across rows. It takes in the pointwise values it alone reads, and shares a
  kernel only with a row reduction over the same elements that reads the same tensor
  (Inductor's mix-order reduction, on by default: a norm's backward is one kernel).
- **Never across a library call:** no group may both feed and consume one extern kernel
  (the fused kernel would wait for itself).
- **Never across the forward/backward boundary:** aot_autograd compiles them as two graphs.
- **At most 64 ops per group** (Inductor's ``max_fusion_size``).

A group is one kernel. It reads its inputs from DRAM once: values made outside it,
parameters, inputs. It writes the values read outside it (other kernels, the backward, the
graph's outputs); everything else stays in registers. A group holding a reduction over rows
longer than 1,024 elements runs a looped reduction that reads its inputs twice.

Differences from Inductor:
- no autotuning of GEMM epilogues (a bias or activation fused into a Triton GEMM under
  ``max_autotune``);
- the min-cut partitioner's recomputation of cheap forward ops in the backward is not
  modelled;
- Inductor's CPU backend additionally fuses outer loops of different inner sizes
  (``OuterLoopFusedSchedulerNode``);
- ``tests/test_fusion.py`` compares the groups with Inductor's own CPU scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["FusionGroup", "fusion_groups", "PERSISTENT_MAX", "MAX_FUSION_SIZE"]

#: longest row Inductor reduces in registers in one pass (a persistent reduction)
PERSISTENT_MAX = 1024
#: Inductor's ``config.max_fusion_size``
MAX_FUSION_SIZE = 64


@dataclass(frozen=True)
class FusionGroup:
    """One generated kernel: its member nodes (program order), the bytes it reads and
    writes, and the read passes over its inputs (2 for a looped reduction)."""

    nodes: tuple
    read_bytes: int
    write_bytes: int
    passes: int
    reduction: bool

    @property
    def bytes(self) -> int:
        return self.read_bytes * self.passes + self.write_bytes


def _numel(v) -> int:
    if isinstance(v, torch.Tensor):
        return max(1, v.numel())
    if isinstance(v, (list, tuple)):
        return max([_numel(x) for x in v if isinstance(x, torch.Tensor)] or [1])
    return 1


def _tensor_inputs(n):
    return [m for m in n.all_input_nodes if isinstance(m.meta.get("val"), torch.Tensor)
            or isinstance(m.meta.get("val"), (list, tuple))]


class _Groups:
    """Union-find over fusible nodes, with for each group the extern kernels upstream and
    downstream of it (bit sets), to refuse fusions that would make a cycle."""

    def __init__(self, names, up, down, phase, sig):
        self.parent = {n: n for n in names}
        self.size = {n: 1 for n in names}
        self.up = dict(up)
        self.down = dict(down)
        self.phase = phase
        # the reductions' loop shapes (rows, row length) in each group: one at most
        self.sig = {n: ({sig[n]} if sig.get(n) else set()) for n in names}

    def find(self, a):
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a, b) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return True
        if self.phase[ra] != self.phase[rb]:
            return False
        if self.size[ra] + self.size[rb] > MAX_FUSION_SIZE:
            return False
        # an extern kernel downstream of one group and upstream of the other: a cycle
        if self.down[ra] & self.up[rb] or self.down[rb] & self.up[ra]:
            return False
        if not _compatible(self.sig[ra] | self.sig[rb]):  # two loop nests: two kernels
            return False
        self.parent[rb] = ra
        self.sig[ra] |= self.sig[rb]
        self.size[ra] += self.size[rb]
        self.up[ra] |= self.up[rb]
        self.down[ra] |= self.down[rb]
        return True


def _out_numel(n) -> int:
    return _numel(n.meta.get("val"))


def _extern_masks(nodes, bit: dict) -> tuple:
    """``(up, down)``: for every node, a bit mask of the extern kernels upstream of it (its
    ancestors) and downstream (its descendants)."""
    up, down = {}, {}
    for n in nodes:
        acc = 0
        for m in n.all_input_nodes:
            acc |= up.get(m.name, 0) | bit.get(m.name, 0)
        up[n.name] = acc
    for n in reversed(nodes):
        acc = 0
        for u in n.users:
            acc |= down.get(u.name, 0) | bit.get(u.name, 0)
        down[n.name] = acc
    return up, down


def _tensors(v) -> list:
    """The tensors of a node's value (one, or those of a tuple)."""
    return [t for t in (v if isinstance(v, (list, tuple)) else [v])
            if isinstance(t, torch.Tensor)]


def _group_reads(group_nodes, inside: set, category: dict, sizes) -> int:
    """The bytes a fusion group reads from outside it (through views), each value once."""
    reads: dict = {}
    for n in group_nodes:
        for j, m in enumerate(_tensor_inputs(n)):
            src = m
            while category.get(src.name) == "view" and _tensor_inputs(src):
                if src.name in inside:
                    break
                src = _tensor_inputs(src)[0]
            if src.name in inside:
                continue
            # a gather reads the rows it gathers of its source, not the whole source (an
            # embedding lookup of a few tokens reads a few rows of the table)
            cap = _gathered_bytes(n, sizes) if j == 0 else None
            for t in _tensors(m.meta.get("val")):
                b = sizes.bytes(t) if cap is None else min(sizes.bytes(t), cap)
                key = (m.name, id(t))
                reads[key] = max(reads.get(key, 0), b)
    return sum(reads.values())


def fusion_groups(gm, category: dict, sizes, phase_of: dict) -> list:
    """The fusion groups of ``gm``. ``category``: node name -> ``"extern"``, ``"view"``,
    ``"pointwise"`` or ``"reduction"`` (nodes absent run nothing); ``sizes``: an
    ``fxshape.analysis.opcost.Sizes`` for the bytes; ``phase_of``: node name -> phase.
    Returns :class:`FusionGroup` records in program order of their first node."""
    nodes = [n for n in gm.graph.nodes]
    index = {n.name: i for i, n in enumerate(nodes)}
    fusible = {n.name for n in nodes
               if category.get(n.name) in ("pointwise", "reduction", "col_reduction")}
    externs = [n.name for n in nodes if category.get(n.name) == "extern"]
    bit = {name: 1 << i for i, name in enumerate(externs)}

    # the real producers of a node: through views to the node that made the value
    def producers(n, seen=None):
        out = []
        for m in _tensor_inputs(n):
            if category.get(m.name) == "view":
                out.extend(producers(m))
            else:
                out.append(m)
        return out

    up, down = _extern_masks(nodes, bit)

    def dom(n):
        if category.get(n.name) in ("reduction", "col_reduction"):
            return max([_numel(m.meta.get("val")) for m in _tensor_inputs(n)] or [1])
        return _numel(n.meta.get("val"))

    def signature(n):
        """A reduction's loop nest: (rows, row length); None for pointwise ops. A norm or
        softmax (same-size output) reduces its last dimension."""
        if category.get(n.name) not in ("reduction", "col_reduction"):
            return None
        d, o = dom(n), _out_numel(n)
        rows = d // _row(n) if o == d else o
        return (category[n.name], rows, d // max(rows, 1))

    by_name_sig = {n.name: signature(n) for n in nodes if n.name in fusible}
    groups = _Groups(sorted(fusible, key=index.get), {k: up[k] for k in fusible},
                     {k: down[k] for k in fusible},
                     {k: phase_of.get(k, "forward") for k in fusible}, by_name_sig)

    for n in nodes:  # vertical: a consumer into its producer's group
        if n.name not in fusible or category[n.name] == "col_reduction":
            continue
        for p in producers(n):
            if p.name not in fusible or category[p.name] == "col_reduction":
                continue
            sp, sn = by_name_sig[p.name], by_name_sig[n.name]
            if sp and sn:
                ok = sp == sn  # two reductions: the same loop nest
            elif sp:  # a reduction's epilogue: over its input's domain, or over its rows
                ok = dom(n) in (dom(p), sp[1])
            else:  # a pointwise producer: the consumer's domain (a reduction's prologue)
                ok = dom(n) == dom(p)
            if ok:
                groups.union(p.name, n.name)
    for n in nodes:  # a pointwise value read once is computed where it is read (inlined)
        if category.get(n.name) != "pointwise":
            continue
        readers_of = _real_users(n, category)
        if len(readers_of) == 1 and readers_of[0].name in fusible:
            groups.union(readers_of[0].name, n.name)
    readers: dict = {}
    for n in nodes:  # horizontal: siblings reading one value over one domain
        if n.name in fusible:
            for p in producers(n):
                readers.setdefault(p.name, []).append(n)
    for p, rs in readers.items():
        for a, b in zip(rs, rs[1:]):
            sa, sb = by_name_sig[a.name], by_name_sig[b.name]
            if dom(a) == dom(b) and (not (sa and sb) and "col_reduction" not in (
                    category[a.name], category[b.name]) or sa and sb):
                groups.union(a.name, b.name)  # the union refuses incompatible loop nests

    members: dict = {}
    for name in sorted(fusible, key=index.get):
        members.setdefault(groups.find(name), []).append(name)
    by_name = {n.name: n for n in nodes}
    out_node = next((n for n in nodes if n.op == "output"), None)
    result = []
    for root, names in members.items():
        inside = set(names)
        group_nodes = [by_name[x] for x in names]
        reads = _group_reads(group_nodes, inside, category, sizes)
        # values read outside the group (views of them included) or returned
        writes = sum(sizes.bytes(t) for n in group_nodes
                     if _escapes(n, inside, category, out_node)
                     for t in _tensors(n.meta.get("val")))
        red = [n for n in group_nodes if category[n.name] in ("reduction", "col_reduction")]
        long_rows = any(dom(n) // max(_out_numel(n), 1) > PERSISTENT_MAX
                        or (_out_numel(n) == dom(n) and _row(n) > PERSISTENT_MAX)
                        for n in red)
        result.append(FusionGroup(nodes=tuple(names), read_bytes=reads,
                                  write_bytes=writes, passes=2 if long_rows else 1,
                                  reduction=bool(red)))
    result.sort(key=lambda g: index[g.nodes[0]])
    return result


#: ops that read, of their first input, only the elements their output gathers
_GATHERS = {"embedding", "index_select", "gather", "take_along_dim", "index"}


def _gathered_bytes(n, sizes):
    """The output bytes of a gather node (what it reads of its source), else None."""
    name = getattr(n.target, "__name__", str(n.target)).split(".")[0]
    v = n.meta.get("val")
    if name not in _GATHERS or not isinstance(v, torch.Tensor):
        return None
    return sizes.bytes(v)


def _compatible(sigs) -> bool:
    """Can these reduction loop nests share one kernel? One row reduction, and with it at
    most one column reduction over the same elements (Inductor's mix-order reduction,
    ``triton.mix_order_reduction``, on by default: a norm's input and weight gradients)."""
    rows = [x for x in sigs if x[0] == "reduction"]
    cols = [x for x in sigs if x[0] == "col_reduction"]
    if len(rows) > 1 or len(cols) > 1:
        return False
    return not (rows and cols) or rows[0][1] * rows[0][2] == cols[0][1] * cols[0][2]


def _real_users(n, category) -> list:
    """The nodes that read ``n``'s value, through views."""
    out, stack, seen = [], list(n.users), set()
    while stack:
        u = stack.pop()
        if u.name in seen:
            continue
        seen.add(u.name)
        if category.get(u.name) == "view":
            stack.extend(u.users)
        else:
            out.append(u)
    return out


def _row(n) -> int:
    """The last dimension of a reduction's input (a softmax's or norm's row)."""
    ins = [m.meta.get("val") for m in _tensor_inputs(n)]
    ins = [t for t in ins if isinstance(t, torch.Tensor) and t.dim()]
    return int(ins[0].shape[-1]) if ins else 1


def _escapes(n, inside, category, out_node) -> bool:
    """Is ``n``'s value read outside its group (directly or through views), or returned?"""
    return any(u is out_node or u.op == "output" or u.name not in inside
               for u in _real_users(n, category))
