//! AgenShield's end-to-end tests, linked into one binary (as hickory-dns links its integration
//! tests): each module is one idea, run together with
//! `cargo test -p agenshield-e2e` or one module alone with
//! `cargo test -p agenshield-e2e --test e2e spine::` (build the daemon first:
//! `cargo build -p agenshield-proxy --bin agenshield`).
//!
//! One process runs every module's tests on parallel threads, so nothing here may rely on being
//! alone in its process. What must not overlap is serialised in the support library:
//! `agenshield_e2e::netlab::root_or_skip` hands out one process-wide guard, held for the whole
//! of every root test (the one nftables table `inet agenshield`, throwaway users and their uids,
//! namespaces, a real installation in /opt and /etc); `upstream_pool`'s tests take a lock of
//! their own. Other engineers' runs on the same machine are kept apart with
//! `flock /tmp/ash-root-tests.lock cargo test -p agenshield-e2e`.

mod admin_linux;
mod agents_linux;
mod approvals;
mod audit_checkpoints;
mod audit_export;
mod budget;
mod budgets_linux;
mod compat_linux;
mod control;
mod ctl_edges;
mod dlp;
mod dns_linux;
mod doctor_linux;
mod edges_linux;
mod exec_linux;
mod fleet_limits;
mod goaway_retry;
mod grafana;
mod hardening;
mod identity_linux;
mod install_linux;
mod mcp;
mod memory;
mod observability;
mod passthrough;
mod policy_bundles;
mod records;
mod request_overrides;
mod secret_defaults;
mod secret_positions;
mod secret_providers;
mod secret_sigv4;
mod secret_streams;
mod secrets;
mod secrets_linux;
mod service_notify;
mod spine;
mod suggest;
mod transparent_linux;
mod upstream_pool;
mod upstream_proxy;
mod upstream_selftest;
mod walkthrough_linux;
