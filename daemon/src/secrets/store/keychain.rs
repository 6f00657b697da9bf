//! The macOS secret store: one generic-password item per secret in the System keychain
//! (`/Library/Keychains/System.keychain`), service `secrets.keychain_service`, account = name.
//!
//! Why the System keychain: only root can write it, it survives a reinstall or wipe of the
//! vault directory, and it is where macOS operators expect machine credentials (Keychain
//! Access, `security`). The daemon must run as root to write it.

use std::path::{Path, PathBuf};

use security_framework::base::Error as SecError;
use security_framework::item::{ItemClass, ItemSearchOptions, Limit, Reference, SearchResult};
use security_framework::os::macos::keychain::SecKeychain;
use security_framework::os::macos::keychain_item::SecKeychainItem;
use zeroize::Zeroizing;

use crate::secrets::store::{SecretStore, StoreError, StoreLocation, StoreResult, StoredSecret};
use crate::secrets::{SecretName, SecretValue};

/// The keychain `KeychainStore::open` uses.
pub(crate) const SYSTEM_KEYCHAIN: &str = "/Library/Keychains/System.keychain";

// OSStatus codes (Security/SecBase.h).
const ERR_SEC_WR_PERM: i32 = -61;
const ERR_SEC_AUTH_FAILED: i32 = -25293;
const ERR_SEC_NO_SUCH_KEYCHAIN: i32 = -25294;
const ERR_SEC_DUPLICATE_ITEM: i32 = -25299;
const ERR_SEC_ITEM_NOT_FOUND: i32 = -25300;
const ERR_SEC_INTERACTION_NOT_ALLOWED: i32 = -25308;

/// Attribute keys in a search result's dictionary (the values of `kSecAttrAccount` and
/// `kSecAttrModificationDate`).
const ATTR_ACCOUNT: &str = "acct";
const ATTR_MODIFIED: &str = "mdat";

pub(crate) struct KeychainStore {
    service: String,
    keychain_path: PathBuf,
}

impl KeychainStore {
    /// The System keychain, items of generic-password service `service`.
    pub(crate) fn open(service: &str) -> Result<KeychainStore, StoreError> {
        KeychainStore::open_at(Path::new(SYSTEM_KEYCHAIN), service)
    }

    /// Another keychain file (tests, or an operator's dedicated keychain).
    pub(crate) fn open_at(path: &Path, service: &str) -> Result<KeychainStore, StoreError> {
        // Opening a keychain succeeds even when the file is missing; fail here instead of
        // on the first lookup.
        std::fs::metadata(path).map_err(StoreError::io(path))?;
        if service.is_empty() {
            // An empty service would match every generic password in the keychain.
            return Err(StoreError::Backend(format!(
                "keychain {}: the service name is empty",
                path.display()
            )));
        }
        open_keychain(path)?;
        Ok(KeychainStore {
            service: service.to_string(),
            keychain_path: path.to_path_buf(),
        })
    }
}

impl SecretStore for KeychainStore {
    fn location(&self) -> StoreLocation {
        StoreLocation::Keychain {
            path: self.keychain_path.clone(),
            service: self.service.clone(),
        }
    }

    fn list(&self) -> StoreResult<'_, Vec<StoredSecret>> {
        let (path, service) = (self.keychain_path.clone(), self.service.clone());
        Box::pin(blocking(move || list_now(&path, &service)))
    }

    fn get<'a>(&'a self, name: &'a SecretName) -> StoreResult<'a, Option<SecretValue>> {
        let (path, service, name) = (
            self.keychain_path.clone(),
            self.service.clone(),
            name.clone(),
        );
        Box::pin(blocking(move || get_now(&path, &service, &name)))
    }

    fn put<'a>(&'a self, name: &'a SecretName, value: &'a SecretValue) -> StoreResult<'a, ()> {
        let (path, service, name) = (
            self.keychain_path.clone(),
            self.service.clone(),
            name.clone(),
        );
        // `to_vec` allocates exactly once, so the only copy is the one zeroized on drop.
        let bytes = Zeroizing::new(value.expose().to_vec());
        Box::pin(blocking(move || put_now(&path, &service, &name, &bytes)))
    }

    fn remove<'a>(&'a self, name: &'a SecretName) -> StoreResult<'a, bool> {
        let (path, service, name) = (
            self.keychain_path.clone(),
            self.service.clone(),
            name.clone(),
        );
        Box::pin(blocking(move || remove_now(&path, &service, &name)))
    }
}

/// Runs a keychain call on the blocking pool: Security framework calls take locks and may
/// touch disk (and `securityd`).
async fn blocking<T, F>(f: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result,
        // Not the panic message: keep anything the call had in hand out of the error.
        Err(e) if e.is_panic() => Err(StoreError::Backend("keychain call panicked".into())),
        Err(_) => Err(StoreError::Backend("keychain call was cancelled".into())),
    }
}

fn list_now(path: &Path, service: &str) -> Result<Vec<StoredSecret>, StoreError> {
    let keychain = open_keychain(path)?;
    let found = ItemSearchOptions::new()
        .class(ItemClass::generic_password())
        .service(service)
        .keychains(&[keychain])
        .load_attributes(true)
        .limit(Limit::All)
        .search();
    let mut out = Vec::new();
    // Attributes only (no `load_data`), so no value is decrypted or copied here.
    for result in not_found_is_empty(found).map_err(backend(path))? {
        let Some(attrs) = result.simplify_dict() else {
            continue;
        };
        let Some(account) = attrs.get(ATTR_ACCOUNT) else {
            continue;
        };
        let Ok(name) = SecretName::new(account) else {
            tracing::warn!(keychain = ?path, service, account = ?account, "keychain: ignoring an item whose account is not a valid secret name");
            continue;
        };
        let updated = attrs
            .get(ATTR_MODIFIED)
            .and_then(|d| keychain_date_rfc3339(d));
        out.push(StoredSecret { name, updated });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn get_now(
    path: &Path,
    service: &str,
    name: &SecretName,
) -> Result<Option<SecretValue>, StoreError> {
    let keychain = open_keychain(path)?;
    let (password, _item) = match keychain.find_generic_password(service, name.as_str()) {
        Ok(found) => found,
        Err(e) if e.code() == ERR_SEC_ITEM_NOT_FOUND => return Ok(None),
        Err(e) => return Err(backend(path)(e)),
    };
    // Sized up front so no reallocation leaves an unzeroized copy behind; `password` (the
    // framework's buffer) is released right after.
    let mut bytes = Zeroizing::new(Vec::with_capacity(password.len()));
    bytes.extend_from_slice(&password);
    drop(password);
    SecretValue::new(std::mem::take(&mut *bytes))
        .map(Some)
        .map_err(|why| StoreError::BadValue {
            name: name.to_string(),
            why: why.to_string(),
        })
}

fn put_now(path: &Path, service: &str, name: &SecretName, value: &[u8]) -> Result<(), StoreError> {
    open_keychain(path)?
        .set_generic_password(service, name.as_str(), value)
        .map_err(backend(path))
}

fn remove_now(path: &Path, service: &str, name: &SecretName) -> Result<bool, StoreError> {
    let items = find_items(path, service, name)?;
    if items.is_empty() {
        return Ok(false);
    }
    for item in items {
        item.delete();
    }
    // `SecKeychainItem::delete` discards the framework's status: look again, so that a
    // refused deletion is not reported as done.
    if !find_items(path, service, name)?.is_empty() {
        return Err(StoreError::Backend(format!(
            "keychain {}: secret {name} is still there after deleting it (the daemon must \
             run as root to change the System keychain)",
            path.display()
        )));
    }
    Ok(true)
}

/// The items of `service` with account `name`, as references (their values are not read).
fn find_items(
    path: &Path,
    service: &str,
    name: &SecretName,
) -> Result<Vec<SecKeychainItem>, StoreError> {
    let keychain = open_keychain(path)?;
    let found = ItemSearchOptions::new()
        .class(ItemClass::generic_password())
        .service(service)
        .account(name.as_str())
        .keychains(&[keychain])
        .load_refs(true)
        .limit(Limit::All)
        .search();
    let results = not_found_is_empty(found).map_err(backend(path))?;
    let count = results.len();
    let items: Vec<SecKeychainItem> = results
        .into_iter()
        .filter_map(|r| match r {
            SearchResult::Ref(Reference::KeychainItem(item)) => Some(item),
            _ => None,
        })
        .collect();
    if items.len() != count {
        return Err(StoreError::Backend(format!(
            "keychain {}: the search for secret {name} returned something other than \
             keychain items",
            path.display()
        )));
    }
    Ok(items)
}

fn open_keychain(path: &Path) -> Result<SecKeychain, StoreError> {
    SecKeychain::open(path).map_err(backend(path))
}

/// A framework error as a `StoreError`. Framework messages describe the status code only,
/// never an item's value.
fn backend(path: &Path) -> impl Fn(SecError) -> StoreError + '_ {
    move |e| {
        let advice = hint(e.code()).map(|h| format!("; {h}")).unwrap_or_default();
        StoreError::Backend(format!(
            "keychain {}: {e} (OSStatus {}{advice})",
            path.display(),
            e.code()
        ))
    }
}

/// What an operator can do about the common failures.
fn hint(code: i32) -> Option<&'static str> {
    match code {
        ERR_SEC_WR_PERM | ERR_SEC_AUTH_FAILED => {
            Some("the daemon must run as root to change the System keychain")
        }
        ERR_SEC_NO_SUCH_KEYCHAIN => Some("the keychain file is missing or unreadable"),
        ERR_SEC_INTERACTION_NOT_ALLOWED | ERR_SEC_DUPLICATE_ITEM => Some(
            "an item of that name exists but this program is not in its access list; delete \
             it (`security delete-generic-password`) and store the secret again through the \
             daemon",
        ),
        _ => None,
    }
}

/// "No item matched" is an empty result, not a failure.
fn not_found_is_empty<T>(found: Result<Vec<T>, SecError>) -> Result<Vec<T>, SecError> {
    match found {
        Err(e) if e.code() == ERR_SEC_ITEM_NOT_FOUND => Ok(Vec::new()),
        other => other,
    }
}

/// A keychain date as the framework describes it (`2024-01-02 03:04:05 +0000`), in RFC 3339
/// (UTC); `None` for anything else.
fn keychain_date_rfc3339(text: &str) -> Option<String> {
    let mut parts = text.split_whitespace();
    let (date, clock, offset) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let mut ymd = date.splitn(3, '-');
    let year: i32 = ymd.next()?.parse().ok()?;
    let month: u8 = ymd.next()?.parse().ok()?;
    let day: u8 = ymd.next()?.parse().ok()?;
    let mut hms = clock.splitn(3, ':');
    let hour: u8 = hms.next()?.parse().ok()?;
    let minute: u8 = hms.next()?.parse().ok()?;
    let second: u8 = hms.next()?.parse().ok()?;
    let (sign, off) = match offset.as_bytes().first()? {
        b'+' => (1, &offset[1..]),
        b'-' => (-1, &offset[1..]),
        _ => return None,
    };
    if off.len() != 4 || !off.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let off_hours: i8 = off[..2].parse().ok()?;
    let off_minutes: i8 = off[2..].parse().ok()?;
    let date =
        time::Date::from_calendar_date(year, time::Month::try_from(month).ok()?, day).ok()?;
    let clock = time::Time::from_hms(hour, minute, second).ok()?;
    let offset = time::UtcOffset::from_hms(sign * off_hours, sign * off_minutes, 0).ok()?;
    time::PrimitiveDateTime::new(date, clock)
        .assume_offset(offset)
        .to_offset(time::UtcOffset::UTC)
        .format(&time::format_description::well_known::Rfc3339)
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keychain_dates() {
        assert_eq!(
            keychain_date_rfc3339("2020-09-03 15:44:36 +0000").as_deref(),
            Some("2020-09-03T15:44:36Z")
        );
        assert_eq!(
            keychain_date_rfc3339("2020-09-03 17:44:36 +0200").as_deref(),
            Some("2020-09-03T15:44:36Z")
        );
        for bad in [
            "",
            "unknown",
            "2020-09-03",
            "2020-13-03 15:44:36 +0000",
            "2020-09-03 15:44:36 0000",
            "2020-09-03 15:44:36 +0000 x",
            "<CFDate 0x1 [0x2]>{time = 620840676}",
        ] {
            assert_eq!(keychain_date_rfc3339(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn not_found_is_an_empty_list() {
        let empty = not_found_is_empty::<u8>(Err(SecError::from_code(ERR_SEC_ITEM_NOT_FOUND)));
        assert_eq!(empty.ok(), Some(Vec::new()));
        let denied = not_found_is_empty::<u8>(Err(SecError::from_code(ERR_SEC_WR_PERM)));
        assert_eq!(denied.map_err(|e| e.code()), Err(ERR_SEC_WR_PERM));
    }

    #[test]
    fn hints() {
        assert!(hint(ERR_SEC_WR_PERM).is_some_and(|h| h.contains("root")));
        assert_eq!(hint(ERR_SEC_ITEM_NOT_FOUND), None);
    }
}
