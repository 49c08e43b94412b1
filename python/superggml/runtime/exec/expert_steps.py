"""A MoE block whose experts come from the expert cache, as runtime steps of a GraphPlan: attention and router in
one graph, then the routed experts over chunks of rows, their ids remapped to cache slots in between; the experts
the cache lacks computed on the host first (HostExperts). The graph pieces are arch/moe.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ... import native
from ...arch.base import Memory, StepInputs, Weights
from ...arch.moe import Architecture, build_expert_outputs, build_router, build_router_lookahead, sum_experts
from ...native import Context, Graph, Tensor
from .context import PassContext

GraphFn = Callable[[Context, Graph, Tensor, Tensor, StepInputs], Tensor]


class StepBuilder(Protocol):
    """What a paged MoE block's steps are added to (GraphPlan): its PassContext, the buffers its graphs keep
    alive, and a step per graph."""

    pc: PassContext
    keep: list[Any]

    def graph(
        self, build: GraphFn, kind: str, *, rows_in: int | None = None, rows_out: int | None = None, **step: Any
    ) -> Any: ...


@dataclass
class HostExperts:
    """A row chunk's experts that the device's cache lacks, computed on the host: its graph reads cur_h (F32
    [n_embd, n]), ids_h (I32 [k, n], the experts), w_h (F32 [1, k, n], the router's weights, 0 where the device
    computes) and writes out_h (F32 [n_embd, k, n]), copied to part_d, which the device's experts graph adds to
    its own outputs (weighted by w_d: 0 where the host computes) before the sum."""

    graph: Any
    cur_h: Tensor
    ids_h: Tensor
    w_h: Tensor
    out_h: Tensor
    w_d: Tensor
    part_d: Tensor


def host_experts(plan: StepBuilder, arch: Architecture, il: int, n: int, host: int) -> HostExperts:
    """The host's graph and the buffers of a chunk of n rows of block il's experts (build_paged_block)."""
    hp, k, f32 = arch.hp, arch.hp.n_expert_used, native.GGMLType.F32
    pc = plan.pc
    w = pc.weights  # the weights as the device being built for holds them
    names = arch.expert_tensors(il)
    width = int(w(names[-1]).ne[1])  # the experts' outputs: n_embd, or a latent width (kimi-k3)
    hctx, dctx = native.Context(max_tensors=4), native.Context(max_tensors=2)
    cur_h = hctx.new_tensor(f32, [hp.n_embd, n])
    ids_h = hctx.new_tensor(native.GGMLType.I32, [k, n])
    w_h = hctx.new_tensor(f32, [1, k, n])
    out_h = hctx.new_tensor(f32, [width, k, n])
    w_d = dctx.new_tensor(f32, [1, k, n])
    part_d = dctx.new_tensor(f32, [width, k, n])
    plan.keep += [hctx, dctx, pc.backends[host].alloc_tensors(hctx), pc.backends[0].alloc_tensors(dctx)]
    size = 64 + 16 * k
    ctx = native.Context(max_tensors=size, graph_size=size)
    gf = ctx.new_graph()
    device, w.device = w.device, host  # the weights as the host holds them (the file mapping)
    try:
        out = build_expert_outputs(arch, ctx, w, f"blk.{il}.", cur_h, ids_h, ids_h, w_h, *(w(x) for x in names))
    finally:
        w.device = device
    gf.expand(ctx.cpy(out, out_h))
    plan.keep.append(ctx)
    return HostExperts(gf, cur_h, ids_h, w_h, out_h, w_d, part_d)


def build_paged_block(
    plan: StepBuilder,
    arch: Architecture,
    w: Weights,
    il: int,
    rows: int,
    key: object,
    kv: tuple[Memory, Memory],
) -> None:
    """A block whose experts come from the expert cache, as steps of `plan` (runtime.graph.GraphPlan): attention and
    router in one graph (its state kept in placement.moe, a MoEScratch), then the routed experts, with their ids
    remapped to cache slots in between (Step.experts), in graphs over chunks of placement.expert_rows rows (the
    experts one chunk routes to fit the cache at once; each row's result does not depend on the others in its
    chunk)."""
    placement = plan.pc.placement
    hp, sc, cache = arch.hp, placement.moe, placement.experts
    assert sc is not None and cache is not None, "a paged-experts block without the expert cache"
    k, p = hp.n_expert_used, f"blk.{il}."
    ahead = sc.guess is not None and il + 1 < hp.n_layer and arch.is_moe(il + 1)  # the next block routes too

    def rows_of(ctx: Context, t: Tensor, r0: int = 0, n: int = rows) -> Tensor:  # columns [r0, r0+n) of a [*, n_batch]
        return ctx.view(t, [t.ne[0], n], [t.nb[1]], r0 * t.nb[1])

    def weights_of(ctx: Context, r0: int = 0, n: int = rows) -> Tensor:  # F32 [1, k, n]
        return ctx.view(sc.w, [1, k, n], [sc.w.nb[1], sc.w.nb[2]], r0 * sc.w.nb[2])

    def attn_router(ctx: Context, gf: Graph, act: Tensor, act_out: Tensor, inp: StepInputs) -> Tensor:
        ffn_inp, cur = arch.build_attn_part(ctx, gf, w, inp, il, act, *kv)
        sel, weights = build_router(arch, ctx, w, p, cur, inp.tokens)
        pairs = [
            (ffn_inp, rows_of(ctx, sc.inp)),
            (cur, rows_of(ctx, sc.cur)),
            (sel, rows_of(ctx, sc.sel)),
            (weights, weights_of(ctx)),
        ]
        if ahead and sc.guess is not None:
            pairs.insert(0, (build_router_lookahead(arch, ctx, w, il, cur, inp.tokens), rows_of(ctx, sc.guess)))
        shared = arch.shared_ffn(ctx, w, p, cur)  # over every row: a matmul's result
        if shared is not None:  # may depend on how many it has
            assert sc.shared is not None, "a shared expert without its scratch rows"
            pairs.insert(0, (shared, rows_of(ctx, sc.shared)))
        outs = [ctx.cpy(src, dst) for src, dst in pairs]
        for o in outs[:-1]:
            gf.expand(o)
        return outs[-1]

    plan.graph(attn_router, "block", rows_out=rows, key=key, layer=il, group=il)
    step = placement.expert_rows
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        ictx = native.Context(max_tensors=1)
        ids = ictx.new_tensor(native.GGMLType.I32, [k, n])
        ids.name = f"inp_expert_slots_l{il}_r{r0}"
        plan.keep += [ictx, placement.backends[0].alloc_tensors(ictx)]
        hx = None if placement.host_experts is None else host_experts(plan, arch, il, n, placement.host_experts.host)

        def experts(
            ctx: Context,
            gf: Graph,
            act: Tensor,
            act_out: Tensor,
            inp: StepInputs,
            r0: int = r0,
            n: int = n,
            ids: Tensor = ids,
            hx: HostExperts | None = hx,
        ) -> Tensor:
            outs = build_expert_outputs(
                arch,
                ctx,
                w,
                p,
                rows_of(ctx, sc.cur, r0, n),
                ids,
                rows_of(ctx, sc.sel, r0, n),
                weights_of(ctx, r0, n) if hx is None else hx.w_d,
                *cache.views[il],
            )
            out = arch.experts_out(ctx, w, p, sum_experts(ctx, outs if hx is None else ctx.add(outs, hx.part_d)))
            if sc.shared is not None:
                out = ctx.add(out, rows_of(ctx, sc.shared, r0, n))
            out = arch.build_ffn_out(ctx, w, p, out, rows_of(ctx, sc.inp, r0, n))
            return ctx.cpy(arch.build_block_out(ctx, w, inp, il, out, r0), rows_of(ctx, act, r0, n))

        last = r0 + n >= rows
        n_ahead = min(step, rows) if last and ahead else 0
        plan.graph(
            experts,
            "experts",
            rows_in=rows,
            rows_out=rows,
            key=key,
            group=il,
            experts=il,
            expert_ids=ids,
            expert_row0=r0,
            expert_ahead=n_ahead,
            host_experts=hx,
        )
