"""What the tests share, and the benchmarks with them (benchmarks import tests.helpers; nothing here
imports benchmarks or a test module):

    rand             fresh random inputs, one factory per kind (operands, vectors, scales, positions, ...)
    checks           the tolerance rule, NaN-filled outputs and memory (unwritten elements)
    references       ready-op math by PyTorch in the op's dtype (the rule's baseline)
    fuzz_strategies  random epilogue graphs and their independent fp64 reference
    bad_inputs       the bad-argument matrix of a compiled op
    custom_op_calls  records the coda_ext custom-op calls a function makes
    stubs            a do-nothing kernel library and CPU tensors passing for a GPU's (pytest fixtures)
    autograd_graph   where autograd sums gradients (inputs of the backward graph fed twice)
    titan_llama      a stand-in for torchtitan's Llama 3 (the converter's tests)
    hf_llama         a tiny transformers Llama with random weights (the HF patch's and distributed tests')
"""
