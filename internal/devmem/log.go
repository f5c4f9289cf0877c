package devmem

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/sirupsen/logrus"

	"github.com/spillway-gpu/spillway/shim/config"
)

// prefixed marks every text line as Spillway's: the host's stderr is shared.
type prefixed struct{ logrus.Formatter }

func (p prefixed) Format(e *logrus.Entry) ([]byte, error) {
	b, err := p.Formatter.Format(e)
	return append([]byte("spillway: "), b...), err
}

var levels = map[config.Level]logrus.Level{
	config.LevelError: logrus.ErrorLevel,
	config.LevelWarn:  logrus.WarnLevel,
	config.LevelInfo:  logrus.InfoLevel,
	config.LevelDebug: logrus.DebugLevel,
}

func newLogger(w io.Writer, format config.Format, level config.Level) *logrus.Logger {
	l := logrus.New()
	l.SetOutput(w)
	l.SetLevel(levels[level])
	if format == config.FormatJSON {
		l.SetFormatter(&logrus.JSONFormatter{})
	} else {
		l.SetFormatter(prefixed{&logrus.TextFormatter{DisableColors: true, FullTimestamp: true}})
	}
	return l
}

// logInvalidSettings logs each invalid setting in err (every one that
// config.Parse found, or the log file that cannot be opened) on a line of
// its own, with what every allocation of a process calling api's functions
// answers until it is fixed.
func logInvalidSettings(log *logrus.Logger, err error, api API) {
	for _, e := range config.Errors(err) {
		log.Errorf("%v; every CUDA allocation in this process will fail with %s until it is fixed", e, apiCallNames[api].notInitialized)
	}
}

// openLog builds the configured logger. Nothing is written to disk unless
// SPILLWAY_LOG_FILE asks for it. The file is opened and written without
// ever waiting: a FIFO without a reader (ENXIO) means standard error, and
// a line that a full pipe cannot take is dropped.
func openLog(cfg config.Config) (*logrus.Logger, error) {
	if cfg.LogFile == "" {
		return newLogger(os.Stderr, cfg.LogFormat, cfg.LogLevel), nil
	}
	fd, err := unix.Open(cfg.LogFile, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o644)
	if errors.Is(err, unix.ENXIO) {
		l := newLogger(os.Stderr, cfg.LogFormat, cfg.LogLevel)
		l.Warnf("%s=%s is a FIFO that nobody reads: logging to standard error instead", config.EnvLogFile, cfg.LogFile)
		return l, nil
	}
	if err != nil {
		return newLogger(os.Stderr, cfg.LogFormat, cfg.LogLevel),
			fmt.Errorf("invalid %s=%q: %w (valid example: %s=/tmp/spillway.log)", config.EnvLogFile, cfg.LogFile, err, config.EnvLogFile)
	}
	return newLogger(nonBlocking(fd), cfg.LogFormat, cfg.LogLevel), nil
}

// nonBlocking writes to a descriptor opened with O_NONBLOCK, dropping what
// a full pipe cannot take rather than waiting for its reader.
type nonBlocking int

func (w nonBlocking) Write(b []byte) (int, error) {
	n, err := unix.Write(int(w), b)
	if errors.Is(err, unix.EAGAIN) {
		return len(b), nil
	}
	if err != nil {
		return max(n, 0), fmt.Errorf("writing the log: %w", err)
	}
	return n, nil
}
