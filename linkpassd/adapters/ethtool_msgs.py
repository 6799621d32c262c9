"""The ethtool generic-netlink messages linkpassd reads, declared on
pyroute2's own marshalling (``genlmsg`` plus an ``nla_map``): pyroute2 0.9
parses only ETHTOOL_A_LINKSTATE_LINK and has no STATS_GET or FEC_GET messages.
Numbers from the kernel UAPI: include/uapi/linux/ethtool_netlink_generated.h
and ethtool.h as of Linux 6.18 (Debian 12's 6.1 headers predate EXT_DOWN_CNT
and STATS_SRC).  Declarations only; adapters.ethtool sends and reads them.
"""

from __future__ import annotations

import struct

from pyroute2.netlink import NLA_F_NESTED, genlmsg, nla, nla_string

ETHTOOL_GENL_NAME = "ethtool"
ETHTOOL_GENL_VERSION = 1
ETHTOOL_MSG_LINKSTATE_GET = 6
ETHTOOL_MSG_FEC_GET = 29
ETHTOOL_MSG_MODULE_EEPROM_GET = 31
ETHTOOL_MSG_STATS_GET = 32
ETHTOOL_FLAG_COMPACT_BITSETS = 1 << 0
ETHTOOL_FLAG_STATS = 1 << 2
ETHTOOL_STATS_ETH_PHY = 0  # stats group ids (enum, bit numbers in ETHTOOL_A_STATS_GROUPS)
ETHTOOL_STATS_ETH_MAC = 1
ETHTOOL_STATS_CNT = 4  # groups this code knows of: eth-phy, eth-mac, eth-ctrl, rmon
# Attribute types inside ETHTOOL_A_STATS_GRP_STAT (they start at 0)
ETHTOOL_A_STATS_ETH_PHY_5_SYM_ERR = 0
ETHTOOL_A_STATS_ETH_MAC_6_FCS_ERR = 4

# Module EEPROM addressing (Documentation/networking/ethtool-netlink.rst):
# 256-byte pages, a read stays within one 128-byte half, and the lower half
# is always page 0 of bank 0.
EEPROM_HALF_PAGE = 128
EEPROM_PAGE_LEN = 256

# include/uapi/linux/ethtool.h: enum ethtool_link_ext_state and its substates.
LINK_EXT_STATES = (
    "AUTONEG",
    "LINK_TRAINING_FAILURE",
    "LINK_LOGICAL_MISMATCH",
    "BAD_SIGNAL_INTEGRITY",
    "NO_CABLE",
    "CABLE_ISSUE",
    "EEPROM_ISSUE",
    "CALIBRATION_FAILURE",
    "POWER_BUDGET_EXCEEDED",
    "OVERHEAT",
    "MODULE",
)
# Substates number from 1 within their state.
LINK_EXT_SUBSTATES: dict[str, tuple[str, ...]] = {
    "AUTONEG": (
        "AN_NO_PARTNER_DETECTED",
        "AN_ACK_NOT_RECEIVED",
        "AN_NEXT_PAGE_EXCHANGE_FAILED",
        "AN_NO_PARTNER_DETECTED_FORCE_MODE",
        "AN_FEC_MISMATCH_DURING_OVERRIDE",
        "AN_NO_HCD",
    ),
    "LINK_TRAINING_FAILURE": (
        "LT_KR_FRAME_LOCK_NOT_ACQUIRED",
        "LT_KR_LINK_INHIBIT_TIMEOUT",
        "LT_KR_LINK_PARTNER_DID_NOT_SET_RECEIVER_READY",
        "LT_REMOTE_FAULT",
    ),
    "LINK_LOGICAL_MISMATCH": (
        "LLM_PCS_DID_NOT_ACQUIRE_BLOCK_LOCK",
        "LLM_PCS_DID_NOT_ACQUIRE_AM_LOCK",
        "LLM_PCS_DID_NOT_GET_ALIGN_STATUS",
        "LLM_FC_FEC_IS_NOT_LOCKED",
        "LLM_RS_FEC_IS_NOT_LOCKED",
    ),
    "BAD_SIGNAL_INTEGRITY": (
        "BSI_LARGE_NUMBER_OF_PHYSICAL_ERRORS",
        "BSI_UNSUPPORTED_RATE",
        "BSI_SERDES_REFERENCE_CLOCK_LOST",
        "BSI_SERDES_ALOS",
    ),
    "CABLE_ISSUE": ("CI_UNSUPPORTED_CABLE", "CI_CABLE_TEST_FAILURE"),
    "MODULE": ("MODULE_CMIS_NOT_READY",),
}


def ext_state_name(state: int) -> str:
    """A newer kernel's state still gets a stable name, not a crash."""
    if 0 <= state < len(LINK_EXT_STATES):
        return LINK_EXT_STATES[state]
    return f"UNKNOWN_{state}"


def ext_substate_name(state: int, substate: int) -> str:
    names = LINK_EXT_SUBSTATES.get(ext_state_name(state), ())
    if 1 <= substate <= len(names):
        return names[substate - 1]
    return f"UNKNOWN_{substate}"


# ----------------------------------------------------------------------
# message definitions (pyroute2 marshalling)
# ----------------------------------------------------------------------


class _exact_int(nla_string):
    """An integer attribute whose payload must be exactly its size.  pyroute2's
    own uint types read past a short attribute into the next one; a counter
    built from a neighbour's bytes would be worse than no counter (None)."""

    __slots__ = ()
    int_format = "I"

    def encode(self):
        self["value"] = struct.pack(self.int_format, self["value"])
        nla_string.encode(self)

    def decode(self):
        nla_string.decode(self)
        raw = self["value"]
        ok = len(raw) == struct.calcsize(self.int_format)
        self.value = struct.unpack(self.int_format, raw)[0] if ok else None


class exact_u8(_exact_int):
    __slots__ = ()
    int_format = "B"


class exact_u32(_exact_int):
    __slots__ = ()
    int_format = "I"


class ethtool_header(nla):
    """ETHTOOL_A_HEADER_*: which device, and request flags."""

    __slots__ = ()
    nla_flags = NLA_F_NESTED
    nla_map = (
        (0, "ETHTOOL_A_HEADER_UNSPEC", "none"),
        (1, "ETHTOOL_A_HEADER_DEV_INDEX", "uint32"),
        (2, "ETHTOOL_A_HEADER_DEV_NAME", "asciiz"),
        (3, "ETHTOOL_A_HEADER_FLAGS", "uint32"),
        (4, "ETHTOOL_A_HEADER_PHY_INDEX", "uint32"),
    )


class ethtool_bitset(nla):
    """ETHTOOL_A_BITSET_*, compact form only: a request names groups by bit."""

    __slots__ = ()
    nla_flags = NLA_F_NESTED
    nla_map = (
        (0, "ETHTOOL_A_BITSET_UNSPEC", "none"),
        (1, "ETHTOOL_A_BITSET_NOMASK", "flag"),
        (2, "ETHTOOL_A_BITSET_SIZE", "uint32"),
        (3, "ETHTOOL_A_BITSET_BITS", "none"),
        (4, "ETHTOOL_A_BITSET_VALUE", "uint32"),  # one u32 word covers our bits
        (5, "ETHTOOL_A_BITSET_MASK", "uint32"),
    )


class linkstate_msg(genlmsg):
    __slots__ = ()
    header_attr = "ETHTOOL_A_LINKSTATE_HEADER"
    nla_map = (
        (0, "ETHTOOL_A_LINKSTATE_UNSPEC", "none"),
        (1, "ETHTOOL_A_LINKSTATE_HEADER", "ethtool_header"),
        (2, "ETHTOOL_A_LINKSTATE_LINK", "exact_u8"),
        (3, "ETHTOOL_A_LINKSTATE_SQI", "exact_u32"),
        (4, "ETHTOOL_A_LINKSTATE_SQI_MAX", "exact_u32"),
        (5, "ETHTOOL_A_LINKSTATE_EXT_STATE", "exact_u8"),
        (6, "ETHTOOL_A_LINKSTATE_EXT_SUBSTATE", "exact_u8"),
        (7, "ETHTOOL_A_LINKSTATE_EXT_DOWN_CNT", "exact_u32"),
    )
    ethtool_header = ethtool_header
    exact_u8 = exact_u8
    exact_u32 = exact_u32


class stats_msg(genlmsg):
    """STATS_GET: the IEEE 802.3 standard counter groups."""

    __slots__ = ()
    header_attr = "ETHTOOL_A_STATS_HEADER"
    nla_map = (
        (0, "ETHTOOL_A_STATS_UNSPEC", "none"),
        (1, "ETHTOOL_A_STATS_PAD", "none"),
        (2, "ETHTOOL_A_STATS_HEADER", "ethtool_header"),
        (3, "ETHTOOL_A_STATS_GROUPS", "ethtool_bitset"),
        (4, "ETHTOOL_A_STATS_GRP", "stats_grp"),
        (5, "ETHTOOL_A_STATS_SRC", "uint32"),
    )
    ethtool_header = ethtool_header
    ethtool_bitset = ethtool_bitset

    class stats_grp(nla):
        __slots__ = ()
        nla_flags = NLA_F_NESTED
        nla_map = (
            (0, "ETHTOOL_A_STATS_GRP_UNSPEC", "none"),
            (1, "ETHTOOL_A_STATS_GRP_PAD", "none"),
            (2, "ETHTOOL_A_STATS_GRP_ID", "exact_u32"),
            (3, "ETHTOOL_A_STATS_GRP_SS_ID", "exact_u32"),
            (4, "ETHTOOL_A_STATS_GRP_STAT", "grp_stat"),
            (5, "ETHTOOL_A_STATS_GRP_HIST_RX", "none"),
            (6, "ETHTOOL_A_STATS_GRP_HIST_TX", "none"),
        )
        exact_u32 = exact_u32

        class grp_stat(nla_string):
            """One counter: a nest holding a single u64 attribute whose *type*
            is the counter's id, starting at 0, which pyroute2's table-driven
            decoder cannot express.  Decodes to ``(id, value)`` or None."""

            __slots__ = ()

            def decode(self):
                nla_string.decode(self)
                raw = self["value"]
                self.value = None
                if len(raw) >= 12:
                    length, kind = struct.unpack_from("HH", raw, 0)
                    if length >= 12:
                        self.value = (kind & ~NLA_F_NESTED, struct.unpack_from("Q", raw, 4)[0])


class fec_msg(genlmsg):
    """FEC_GET with ETHTOOL_FLAG_STATS: corrected/uncorrectable FEC blocks."""

    __slots__ = ()
    header_attr = "ETHTOOL_A_FEC_HEADER"
    nla_map = (
        (0, "ETHTOOL_A_FEC_UNSPEC", "none"),
        (1, "ETHTOOL_A_FEC_HEADER", "ethtool_header"),
        (2, "ETHTOOL_A_FEC_MODES", "none"),
        (3, "ETHTOOL_A_FEC_AUTO", "exact_u8"),
        (4, "ETHTOOL_A_FEC_ACTIVE", "exact_u32"),
        (5, "ETHTOOL_A_FEC_STATS", "fec_stats"),
    )
    ethtool_header = ethtool_header
    exact_u8 = exact_u8
    exact_u32 = exact_u32

    class fec_stats(nla):
        """Each counter is a u64 array: the total, then one per lane."""

        __slots__ = ()
        nla_flags = NLA_F_NESTED
        nla_map = (
            (0, "ETHTOOL_A_FEC_STAT_UNSPEC", "none"),
            (1, "ETHTOOL_A_FEC_STAT_PAD", "none"),
            (2, "ETHTOOL_A_FEC_STAT_CORRECTED", "array(uint64)"),
            (3, "ETHTOOL_A_FEC_STAT_UNCORR", "array(uint64)"),
            (4, "ETHTOOL_A_FEC_STAT_CORR_BITS", "array(uint64)"),
        )


class module_eeprom_msg(genlmsg):
    __slots__ = ()
    header_attr = "ETHTOOL_A_MODULE_EEPROM_HEADER"
    nla_map = (
        (0, "ETHTOOL_A_MODULE_EEPROM_UNSPEC", "none"),
        (1, "ETHTOOL_A_MODULE_EEPROM_HEADER", "ethtool_header"),
        (2, "ETHTOOL_A_MODULE_EEPROM_OFFSET", "uint32"),
        (3, "ETHTOOL_A_MODULE_EEPROM_LENGTH", "uint32"),
        (4, "ETHTOOL_A_MODULE_EEPROM_PAGE", "uint8"),
        (5, "ETHTOOL_A_MODULE_EEPROM_BANK", "uint8"),
        (6, "ETHTOOL_A_MODULE_EEPROM_I2C_ADDRESS", "uint8"),
        (7, "ETHTOOL_A_MODULE_EEPROM_DATA", "cdata"),
    )
    ethtool_header = ethtool_header
