// A Go client for the compat suite: GET each URL with net/http's defaults (its roots come
// from the system, or SSL_CERT_FILE), print the status.
package main

import (
	"fmt"
	"net/http"
	"os"
)

func main() {
	resp, err := http.Get(os.Args[1])
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	defer resp.Body.Close()
	fmt.Println(resp.StatusCode)
}
