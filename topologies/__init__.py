"""Topology (cloud, edges, clients as a networkx graph), datasets and data placement."""
from .dataset import Dataset
from .datasets import DATASETS, load_dataset, read_idx
from .partition import client_sizes, dirichlet_partition, label_matrix
from .topology import Link, Topology, assign_devices, build_topology

__all__ = ["DATASETS", "Dataset", "load_dataset", "read_idx", "client_sizes", "dirichlet_partition",
           "label_matrix", "Link", "Topology", "assign_devices", "build_topology"]
