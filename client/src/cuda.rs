//! Registering host memory with CUDA at run time, so that a copy from a same-host region to the
//! GPU is one DMA instead of a staging copy through the driver's own pinned buffer.
//!
//! The CUDA runtime is loaded with dlopen (`$HYDRANT_CUDART`, else `libcudart.so.12`, else
//! `libcudart.so`); hydrant has no build-time CUDA dependency. Without the library, a driver or
//! a device, registration fails with a typed error and everything else works unpinned.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::fmt;
use std::sync::Arc;

/// `cudaErrorStubLibrary`: the library found is a stub (no real runtime behind it).
const CUDA_ERROR_STUB_LIBRARY: c_int = 34;
/// `cudaErrorInsufficientDriver`: no driver, or one older than the runtime.
const CUDA_ERROR_INSUFFICIENT_DRIVER: c_int = 35;
/// `cudaErrorNoDevice`.
const CUDA_ERROR_NO_DEVICE: c_int = 100;
/// `cudaHostRegisterPortable`: pinned for every CUDA context, not just the current one.
const CUDA_HOST_REGISTER_PORTABLE: c_uint = 1;
/// Library names tried in order after `$HYDRANT_CUDART`.
const CUDART_NAMES: [&str; 2] = ["libcudart.so.12", "libcudart.so"];

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CudaError {
    /// No CUDA runtime library could be loaded (what was tried, and dlerror's words).
    NotFound(String),
    /// The library lacks a function hydrant needs.
    MissingSymbol(&'static str),
    /// cudaErrorInsufficientDriver (35): no NVIDIA driver, or an older one.
    NoDriver,
    /// cudaErrorNoDevice (100).
    NoDevice,
    /// cudaErrorStubLibrary (34).
    Stub,
    /// Any other cudaError_t.
    Other(i32),
}

impl CudaError {
    fn from_code(code: c_int) -> CudaError {
        match code {
            CUDA_ERROR_INSUFFICIENT_DRIVER => CudaError::NoDriver,
            CUDA_ERROR_NO_DEVICE => CudaError::NoDevice,
            CUDA_ERROR_STUB_LIBRARY => CudaError::Stub,
            other => CudaError::Other(other),
        }
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::NotFound(tried) => write!(formatter, "no CUDA runtime: {tried}"),
            CudaError::MissingSymbol(name) => {
                write!(formatter, "the CUDA runtime has no {name}")
            }
            CudaError::NoDriver => {
                write!(formatter, "no CUDA driver (cudaErrorInsufficientDriver)")
            }
            CudaError::NoDevice => write!(formatter, "no CUDA device (cudaErrorNoDevice)"),
            CudaError::Stub => write!(formatter, "the CUDA runtime is a stub library"),
            CudaError::Other(code) => write!(formatter, "CUDA error {code}"),
        }
    }
}

impl std::error::Error for CudaError {}

type HostRegister = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> c_int;
type HostUnregister = unsafe extern "C" fn(*mut c_void) -> c_int;

/// A loaded CUDA runtime. It is never unloaded (the runtime does not support being unloaded
/// while contexts may exist), so its functions stay valid for the life of the process.
pub struct CudaRuntime {
    path: String,
    host_register: HostRegister,
    host_unregister: HostUnregister,
}

// SAFETY: the handle is never closed and the function pointers are thread-safe CUDA entry points.
unsafe impl Send for CudaRuntime {}
unsafe impl Sync for CudaRuntime {}

impl CudaRuntime {
    /// `$HYDRANT_CUDART` if set, else the usual library names.
    pub fn load() -> Result<Arc<CudaRuntime>, CudaError> {
        let mut tried = Vec::new();
        let mut names: Vec<String> = Vec::new();
        if let Ok(path) = std::env::var("HYDRANT_CUDART") {
            names.push(path);
        }
        names.extend(CUDART_NAMES.iter().map(|name| name.to_string()));
        for name in names {
            match CudaRuntime::load_from(&name) {
                Ok(runtime) => return Ok(runtime),
                Err(CudaError::NotFound(why)) => tried.push(why),
                Err(other) => return Err(other),
            }
        }
        Err(CudaError::NotFound(tried.join("; ")))
    }

    /// Load the runtime at `path` (a file name searched as dlopen does, or a path).
    pub fn load_from(path: &str) -> Result<Arc<CudaRuntime>, CudaError> {
        let name = CString::new(path).map_err(|_| CudaError::NotFound(format!("{path:?}")))?;
        // SAFETY: dlopen with a NUL-terminated name; loading runs the library's initialisers,
        // which is what loading a CUDA runtime means.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(CudaError::NotFound(format!("{path}: {}", dlerror())));
        }
        let host_register = symbol(handle, c"cudaHostRegister", "cudaHostRegister")?;
        let host_unregister = symbol(handle, c"cudaHostUnregister", "cudaHostUnregister")?;
        // SAFETY: the symbols have these C signatures in every CUDA runtime since 4.0.
        let (host_register, host_unregister) = unsafe {
            (
                std::mem::transmute::<*mut c_void, HostRegister>(host_register),
                std::mem::transmute::<*mut c_void, HostUnregister>(host_unregister),
            )
        };
        Ok(Arc::new(CudaRuntime {
            path: path.to_string(),
            host_register,
            host_unregister,
        }))
    }

    /// What was loaded.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Page-lock `len` bytes at `address` for DMA by any CUDA context.
    ///
    /// # Safety
    /// `address..address + len` must be mapped memory that stays mapped until `unregister`.
    pub unsafe fn register(&self, address: *mut u8, len: usize) -> Result<(), CudaError> {
        let code = (self.host_register)(address.cast(), len, CUDA_HOST_REGISTER_PORTABLE);
        if code == 0 {
            Ok(())
        } else {
            Err(CudaError::from_code(code))
        }
    }

    /// Undo `register`.
    ///
    /// # Safety
    /// `address` must have been registered with this runtime.
    pub unsafe fn unregister(&self, address: *mut u8) -> Result<(), CudaError> {
        let code = (self.host_unregister)(address.cast());
        if code == 0 {
            Ok(())
        } else {
            Err(CudaError::from_code(code))
        }
    }
}

fn symbol(handle: *mut c_void, name: &CStr, label: &'static str) -> Result<*mut c_void, CudaError> {
    // SAFETY: handle came from a successful dlopen; name is NUL-terminated.
    let address = unsafe { libc::dlsym(handle, name.as_ptr()) };
    if address.is_null() {
        return Err(CudaError::MissingSymbol(label));
    }
    Ok(address)
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call on
    // this thread; it is copied at once.
    let message: *const c_char = unsafe { libc::dlerror() };
    if message.is_null() {
        return "unknown error".into();
    }
    unsafe { CStr::from_ptr(message) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_not_found() {
        let error = CudaRuntime::load_from("libhydrant-no-such-cudart.so.99")
            .err()
            .expect("no such library");
        assert!(matches!(error, CudaError::NotFound(_)), "{error:?}");
    }

    #[test]
    fn error_codes_map_to_kinds() {
        assert_eq!(CudaError::from_code(35), CudaError::NoDriver);
        assert_eq!(CudaError::from_code(100), CudaError::NoDevice);
        assert_eq!(CudaError::from_code(34), CudaError::Stub);
        assert_eq!(CudaError::from_code(2), CudaError::Other(2));
    }
}
