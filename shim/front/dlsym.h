/* dlsym.h: what the front's dlsym (dlsym.c) and the rest of the front share. */
#ifndef SPILLWAY_FRONT_DLSYM_H
#define SPILLWAY_FRONT_DLSYM_H

/* The C library's dlsym, called directly: for lookups on a handle. */
__attribute__((visibility("hidden"))) void *front_dlsym_real(void *handle, const char *name);

/* The C library's dlclose, called directly: closing uncounted. */
__attribute__((visibility("hidden"))) int front_dlclose_real(void *handle);

/* How many times a CUDA library (libcuda, libcudart, libnvidia-ml) was closed. */
__attribute__((visibility("hidden"))) extern unsigned int front_unloads;

/*
 * The prefix of the CUDA library (library_of's: "libcuda.", "libcudart",
 * "libnvidia-ml") function f lies in, or NULL when it lies in none of
 * them (a static runtime in the executable).
 */
__attribute__((visibility("hidden"))) const char *front_library_holding(void *f);

/* The front's function that stands for the real function f of library, or NULL. */
__attribute__((visibility("hidden"))) void *front_wrapper_of(void *f, const char *library);

#endif
