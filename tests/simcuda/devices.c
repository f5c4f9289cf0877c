/*
 * devices.c - parses SIMCUDA_DEVICES and derives the per-device facts that the
 * driver and NVML must report identically (see devices.h).
 */
#include "devices.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char syntax[] =
	"expected a comma-separated list of [<count>x]<size> items with <size> an integer "
	"optionally followed by B, KiB, MiB, GiB or TiB, e.g. 16GiB, 2x16GiB or 80GiB,24GiB";

static int unit_shift(const char *s, size_t len, int *shift)
{
	static const struct {
		const char *name;
		int shift;
	} units[] = {{"", 0}, {"B", 0}, {"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}};

	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strlen(units[i].name) == len && memcmp(units[i].name, s, len) == 0) {
			*shift = units[i].shift;
			return 0;
		}
	}
	return -1;
}

/* Parses a decimal integer of at most 19 digits from s[0..len). */
static int parse_count(const char *s, size_t len, uint64_t *out)
{
	uint64_t v = 0;

	if (len == 0 || len > 19)
		return -1;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	*out = v;
	return 0;
}

static int parse_item(const char *item, size_t len, struct simcuda_devices *cfg, char *err,
		      size_t errlen)
{
	uint64_t count = 1, size;
	const char *x = memchr(item, 'x', len);
	const char *p = item;
	size_t n = len;
	int shift;

	if (x != NULL) {
		if (parse_count(item, (size_t)(x - item), &count) != 0 || count == 0) {
			snprintf(err, errlen, "item \"%.*s\": bad device count before 'x'", (int)len, item);
			return -1;
		}
		p = x + 1;
		n = len - (size_t)(p - item);
	}
	size_t digits = 0;
	while (digits < n && p[digits] >= '0' && p[digits] <= '9')
		digits++;
	if (parse_count(p, digits, &size) != 0 || unit_shift(p + digits, n - digits, &shift) != 0) {
		snprintf(err, errlen, "item \"%.*s\": bad size", (int)len, item);
		return -1;
	}
	if (size == 0 || size > (UINT64_MAX >> 1 >> shift)) {
		snprintf(err, errlen, "item \"%.*s\": size must be positive and below 8 EiB", (int)len,
			 item);
		return -1;
	}
	if (count > (uint64_t)(SIMCUDA_MAX_DEVICES - cfg->count)) {
		snprintf(err, errlen, "item \"%.*s\": more than %d devices in all", (int)len, item,
			 SIMCUDA_MAX_DEVICES);
		return -1;
	}
	for (uint64_t i = 0; i < count; i++)
		cfg->capacity[cfg->count++] = size << shift;
	return 0;
}

int simcuda_parse_size(const char *s, uint64_t *bytes)
{
	size_t len = strlen(s), digits = 0;
	uint64_t v;
	int shift;

	while (digits < len && s[digits] >= '0' && s[digits] <= '9')
		digits++;
	if (parse_count(s, digits, &v) != 0 || unit_shift(s + digits, len - digits, &shift) != 0 ||
	    v > (UINT64_MAX >> 1 >> shift))
		return -1;
	*bytes = v << shift;
	return 0;
}

int simcuda_devices_parse(const char *spec, struct simcuda_devices *cfg, char *err, size_t errlen)
{
	char why[256];

	memset(cfg, 0, sizeof(*cfg));
	if (spec == NULL || spec[0] == '\0') {
		cfg->count = 1;
		cfg->capacity[0] = SIMCUDA_DEFAULT_CAPACITY;
		return 0;
	}
	for (const char *item = spec;;) {
		const char *end = strchr(item, ',');
		size_t len = end != NULL ? (size_t)(end - item) : strlen(item);

		if (len == 0) {
			snprintf(why, sizeof(why), "empty item");
			goto bad;
		}
		if (parse_item(item, len, cfg, why, sizeof(why)) != 0)
			goto bad;
		if (end == NULL)
			return 0;
		item = end + 1;
	}
bad:
	snprintf(err, errlen, "SIMCUDA_DEVICES=\"%s\": %s; %s", spec, why, syntax);
	memset(cfg, 0, sizeof(*cfg));
	return -1;
}

int simcuda_devices_load(struct simcuda_devices *cfg)
{
	char err[768];

	if (simcuda_devices_parse(getenv("SIMCUDA_DEVICES"), cfg, err, sizeof(err)) != 0) {
		fprintf(stderr, "simcuda: %s\n", err);
		return -1;
	}
	return 0;
}

/* The device entry [s, s+len) names, or -1. */
static int visible_entry(const struct simcuda_devices *cfg, const char *s, size_t len)
{
	uint64_t index;
	int found = -1;

	if (parse_count(s, len, &index) == 0)
		return index < (uint64_t)cfg->count ? (int)index : -1;
	if (len <= 4 || strncmp(s, "GPU-", 4) != 0)
		return -1;
	for (int i = 0; i < cfg->count; i++) {
		char uuid[64];

		simcuda_device_uuid_string(i, cfg->capacity[i], uuid, sizeof(uuid));
		if (len <= strlen(uuid) && memcmp(uuid, s, len) == 0) {
			if (found >= 0)
				return -1; /* the prefix names more than one device */
			found = i;
		}
	}
	return found;
}

int simcuda_visible_devices(const struct simcuda_devices *cfg, const char *spec,
			    int physical[SIMCUDA_MAX_DEVICES])
{
	int n = 0;

	if (spec == NULL) {
		for (; n < cfg->count; n++)
			physical[n] = n;
		return n;
	}
	for (const char *entry = spec; *spec != '\0' && n < cfg->count;) {
		const char *end = strchr(entry, ',');
		size_t len = end != NULL ? (size_t)(end - entry) : strlen(entry);
		int dev = visible_entry(cfg, entry, len);

		for (int i = 0; i < n && dev >= 0; i++)
			if (physical[i] == dev)
				dev = -1;
		if (dev < 0)
			break;
		physical[n++] = dev;
		if (end == NULL)
			break;
		entry = end + 1;
	}
	return n;
}

void simcuda_device_name(int ordinal, uint64_t capacity, char *buf, size_t size)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	int u = 0;

	(void)ordinal;
	while (u < 4 && capacity >= 1024 && capacity % 1024 == 0) {
		capacity /= 1024;
		u++;
	}
	snprintf(buf, size, "simcuda GPU %" PRIu64 "%s", capacity, units[u]);
}

void simcuda_device_uuid(int ordinal, uint64_t capacity, unsigned char uuid[16])
{
	/* splitmix64 of (ordinal, capacity): stable across processes, distinct per device. */
	uint64_t x = ((uint64_t)(unsigned)ordinal << 56) ^ capacity;

	for (int half = 0; half < 2; half++) {
		uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
		z ^= z >> 31;
		for (int i = 0; i < 8; i++)
			uuid[half * 8 + i] = (unsigned char)(z >> (8 * i));
	}
	uuid[6] = (unsigned char)((uuid[6] & 0x0f) | 0x40); /* version 4 */
	uuid[8] = (unsigned char)((uuid[8] & 0x3f) | 0x80); /* RFC 4122 variant */
}

void simcuda_device_uuid_string(int ordinal, uint64_t capacity, char *buf, size_t size)
{
	unsigned char u[16];

	simcuda_device_uuid(ordinal, capacity, u);
	snprintf(buf, size,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
		 u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
		 u[14], u[15]);
}
