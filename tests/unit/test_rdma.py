"""adapters.rdma: netdev -> (RDMA device, port) from a fake sysfs tree."""

import os

from linkpassd.adapters.rdma import rdma_ports


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def roce_port(sysfs, device, port, *netdevs):
    """A RoCE port whose GID table entries name `netdevs` (one entry each; the
    rest of a real table are unset entries, which are absent or unreadable)."""
    ndevs = sysfs / "class" / "infiniband" / device / "ports" / str(port) / "gid_attrs" / "ndevs"
    ndevs.mkdir(parents=True, exist_ok=True)
    for i, netdev in enumerate(netdevs):
        write(ndevs / str(i), netdev + "\n")


def pci_link(sysfs, netdev, *devices, dev_port=None):
    """/sys/class/net/<netdev>/device/infiniband/<dev> (directories, as the kernel has)."""
    base = sysfs / "class" / "net" / netdev
    (base / "device" / "infiniband").mkdir(parents=True, exist_ok=True)
    for device in devices:
        (base / "device" / "infiniband" / device).mkdir()
    if dev_port is not None:
        write(base / "dev_port", f"{dev_port}\n")


def ib_ports(sysfs, device, *numbers):
    for n in numbers:
        (sysfs / "class" / "infiniband" / device / "ports" / str(n)).mkdir(parents=True, exist_ok=True)


def test_gid_table_maps_each_netdev_to_its_device_and_port(tmp_path):
    roce_port(tmp_path, "mlx5_0", 1, "eth0", "eth0", "eth0.100")
    roce_port(tmp_path, "mlx5_3", 1, "eth3")
    roce_port(tmp_path, "mlx4_0", 1, "ens1")
    roce_port(tmp_path, "mlx4_0", 2, "ens2")
    got = rdma_ports(["eth0", "eth3", "ens1", "ens2", "veth9"], sysfs=str(tmp_path))
    assert got == {"eth0": ("mlx5_0", 1), "eth3": ("mlx5_3", 1), "ens1": ("mlx4_0", 1), "ens2": ("mlx4_0", 2)}


def test_only_the_asked_netdevs_are_answered(tmp_path):
    roce_port(tmp_path, "mlx5_0", 1, "eth0")
    roce_port(tmp_path, "mlx5_1", 1, "eth1")
    assert rdma_ports(["eth1"], sysfs=str(tmp_path)) == {"eth1": ("mlx5_1", 1)}
    assert rdma_ports([], sysfs=str(tmp_path)) == {}


def test_a_netdev_named_by_two_ports_gets_the_first_in_natural_order(tmp_path):
    roce_port(tmp_path, "mlx5_10", 1, "bond0")
    roce_port(tmp_path, "mlx5_2", 1, "bond0")
    assert rdma_ports(["bond0"], sysfs=str(tmp_path)) == {"bond0": ("mlx5_2", 1)}


def test_pci_function_link_with_a_single_port_device(tmp_path):
    # IPoIB: no GID ndevs, but the netdev's PCI function has the RDMA device.
    pci_link(tmp_path, "ib0", "mlx5_4")
    ib_ports(tmp_path, "mlx5_4", 1)
    assert rdma_ports(["ib0"], sysfs=str(tmp_path)) == {"ib0": ("mlx5_4", 1)}


def test_pci_function_link_on_a_dual_port_device_uses_dev_port(tmp_path):
    pci_link(tmp_path, "ib1", "mlx4_0", dev_port=1)
    pci_link(tmp_path, "ib9", "mlx4_0", dev_port=5)  # no port 6: left out, not guessed
    pci_link(tmp_path, "ib8", "mlx4_0")  # no dev_port: left out
    ib_ports(tmp_path, "mlx4_0", 1, 2)
    assert rdma_ports(["ib1", "ib9", "ib8"], sysfs=str(tmp_path)) == {"ib1": ("mlx4_0", 2)}


def test_gid_table_wins_over_the_pci_link(tmp_path):
    roce_port(tmp_path, "mlx4_0", 2, "ens2")
    pci_link(tmp_path, "ens2", "mlx4_0", dev_port=0)  # would say port 1
    ib_ports(tmp_path, "mlx4_0", 1, 2)
    assert rdma_ports(["ens2"], sysfs=str(tmp_path)) == {"ens2": ("mlx4_0", 2)}


def test_missing_sysfs_or_no_rdma_at_all_is_an_empty_answer(tmp_path):
    assert rdma_ports(["eth0"], sysfs=str(tmp_path / "nowhere")) == {}
    (tmp_path / "class" / "net" / "veth0").mkdir(parents=True)  # a netdev without a device
    assert rdma_ports(["veth0"], sysfs=str(tmp_path)) == {}


def test_odd_files_are_skipped_not_raised(tmp_path):
    ports_dir = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports"
    write(ports_dir / "abc" / "gid_attrs" / "ndevs" / "0", "eth7")  # not a port number
    write(ports_dir / "0" / "gid_attrs" / "ndevs" / "0", "eth7")  # port 0 does not exist in IB
    write(ports_dir / "1" / "gid_attrs" / "ndevs" / "0", "\xff\xfe")  # not ASCII
    (ports_dir / "1" / "gid_attrs" / "ndevs" / "1").mkdir()  # a directory where a file belongs
    write(ports_dir / "1" / "gid_attrs" / "ndevs" / "2", "")  # unset entry read as empty
    write(ports_dir / "1" / "gid_attrs" / "ndevs" / "3", "eth1\n")
    write(tmp_path / "class" / "infiniband" / "mlx5_9" / "ports", "a file, not a directory")
    pci_link(tmp_path, "eth5", "mlx5_5", "mlx5_6")  # two devices: ambiguous, left out
    assert rdma_ports(["eth7", "eth1", "eth5", "../..", "."], sysfs=str(tmp_path)) == {"eth1": ("mlx5_0", 1)}


def test_the_real_sysfs_answers_without_error():
    # This machine has no RDMA (LAB.md); the call must still be safe on it.
    got = rdma_ports(os.listdir("/sys/class/net"))
    assert all(isinstance(dev, str) and isinstance(n, int) and n > 0 for dev, n in got.values())
