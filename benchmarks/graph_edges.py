"""How a captured CUDA graph links its kernels: each edge's type, read from the graph itself through the
driver API. A kernel launched with programmatic dependent launch (PDL) is captured behind a programmatic
edge, on which it may start before the kernel it depends on has finished; any other launch is behind a
default edge. Grouped by the libraries on the edge's two sides (graph_timeline.library), this says which
boundaries of a graph can overlap at all, as its CUPTI trace says which did.

The graph must still hold its template: capture it with capture_graph(..., keep_graph=True)."""

from __future__ import annotations

import ctypes

import torch

from benchmarks.graph_timeline import library

CU_GRAPH_NODE_TYPE_KERNEL = 0
EDGE_TYPES = {0: "default", 1: "programmatic"}
PORTS = {0: "", 1: "@trigger", 2: "@launch-order"}  # the edge leaves its kernel when done, when triggered, ...


class _EdgeData(ctypes.Structure):  # CUgraphEdgeData
    _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte),
                ("reserved", ctypes.c_ubyte * 5)]


def _check(result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"{what} failed with CUresult {result}")


def _kernel_name(lib, node: int) -> str:
    """A kernel node's function name, from its CUfunction or, where that is a library's kernel handle or
    missing, from its CUkernel."""
    params = (ctypes.c_uint64 * 16)()  # CUDA_KERNEL_NODE_PARAMS_v2: func at byte 0, kern at byte 56
    _check(lib.cuGraphKernelNodeGetParams_v2(ctypes.c_void_p(node), params), "cuGraphKernelNodeGetParams_v2")
    name = ctypes.c_char_p()
    for getter, handle in ((lib.cuFuncGetName, params[0]), (lib.cuKernelGetName, params[0]),
                           (lib.cuKernelGetName, params[7])):
        if handle and getter(ctypes.byref(name), ctypes.c_void_p(handle)) == 0 and name.value:
            return name.value.decode()
    return "<unnamed kernel>"


def node_names(lib, nodes) -> dict[int, str]:
    """node handle -> its kernel's name, or `<node type N>` for copies, memsets and the rest."""
    names = {}
    for node in nodes:
        kind = ctypes.c_int()
        _check(lib.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)), "cuGraphNodeGetType")
        is_kernel = kind.value == CU_GRAPH_NODE_TYPE_KERNEL
        names[node] = _kernel_name(lib, node) if is_kernel else f"<node type {kind.value}>"
    return names


def edges(graph: torch.cuda.CUDAGraph) -> list[tuple[str, str, str]]:
    """(from kernel, to kernel, edge type and the port it leaves from) for every edge of the graph's template."""
    lib, raw = ctypes.CDLL("libcuda.so.1"), ctypes.c_void_p(graph.raw_cuda_graph())
    count = ctypes.c_size_t()
    _check(lib.cuGraphGetNodes(raw, None, ctypes.byref(count)), "cuGraphGetNodes")
    nodes = (ctypes.c_void_p * count.value)()
    _check(lib.cuGraphGetNodes(raw, nodes, ctypes.byref(count)), "cuGraphGetNodes")
    names = node_names(lib, list(nodes))
    _check(lib.cuGraphGetEdges_v2(raw, None, None, None, ctypes.byref(count)), "cuGraphGetEdges_v2")
    n = count.value
    src, dst, data = (ctypes.c_void_p * n)(), (ctypes.c_void_p * n)(), (_EdgeData * n)()
    _check(lib.cuGraphGetEdges_v2(raw, src, dst, data, ctypes.byref(count)), "cuGraphGetEdges_v2")
    return [(names[src[i]], names[dst[i]],
             EDGE_TYPES.get(data[i].type, str(data[i].type)) + PORTS.get(data[i].from_port, f"@{data[i].from_port}"))
            for i in range(n)]


def edge_kinds(rows: list[tuple[str, str, str]]) -> dict:
    """{"cublas->triton": {"programmatic@trigger": n, "default": m}, ...}: a graph's edges (`edges`) counted
    by the libraries on their two sides and by type."""
    kinds: dict[str, dict[str, int]] = {}
    for a, b, kind in rows:
        counts = kinds.setdefault(f"{library(a)}->{library(b)}", {})
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(kinds.items()))


def cublas_edges(rows: list[tuple[str, str, str]], limit: int = 12) -> list[dict]:
    """The first of a graph's edges (`edges`) into and out of cuBLAS's kernels, by name: which GEMM kernels
    sit behind which edge."""
    named = [{"from": a[:70], "to": b[:70], "type": kind} for a, b, kind in rows
             if "cublas" in (library(a), library(b))]
    return named[:limit]
