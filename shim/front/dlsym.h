/* dlsym.h: what the front's dlsym (dlsym.c) and the rest of the front share. */
#ifndef SPILLWAY_FRONT_DLSYM_H
#define SPILLWAY_FRONT_DLSYM_H

/* The C library's dlsym, called directly: for lookups on a handle. */
__attribute__((visibility("hidden"))) void *front_dlsym_real(void *handle, const char *name);

/* The C library's dlclose, called directly: closing uncounted. */
__attribute__((visibility("hidden"))) int front_dlclose_real(void *handle);

/* How many times a CUDA library (libcuda, libcudart, libnvidia-ml) was closed. */
__attribute__((visibility("hidden"))) extern unsigned int front_unloads;

/* The front's function that stands for the real function f, or NULL. */
__attribute__((visibility("hidden"))) void *front_wrapper_of(void *f);

#endif
