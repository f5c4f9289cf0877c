/* Eight bytes of initial-exec thread-local storage: each copy of this
 * library that a process dlopens takes them from glibc's static TLS surplus,
 * which a late dlopen of the Go core also needs. */
__thread long tls_hog __attribute__((tls_model("initial-exec")));

long *tls_hog_addr(void) { return &tls_hog; }
